"""`python -m appliance.cli ...`, as the `shingle` launcher runs it."""

import sys

from appliance.cli.parser import main

sys.exit(main())
