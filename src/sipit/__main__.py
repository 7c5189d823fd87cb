"""`python -m sipit ...` = `sipit ...`."""
import sys

from .cli import main

sys.exit(main())
