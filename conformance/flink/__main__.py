"""``python -m conformance.flink``: see ``conformance.flink.report``."""

import sys

from conformance.flink.report import main

sys.exit(main())
