"""`python -m respec ...` entry point (see respec/cli.py)."""
import sys

from respec.cli import main

if __name__ == "__main__":
    sys.exit(main())
