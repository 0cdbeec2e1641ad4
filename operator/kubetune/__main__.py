import sys

from kubetune.cli import main

sys.exit(main())
