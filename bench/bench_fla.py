"""kdagen vs FLA on the H200 (see kdagen/benchmark.py; same as `kdagen bench`)."""
import sys

from kdagen.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
