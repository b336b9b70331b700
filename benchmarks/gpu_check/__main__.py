import sys

from benchmarks.gpu_check.cli import main

sys.exit(main())
