"""A module whose import takes ``$SLOW_IMPORT_S`` seconds, as a heavy library (torch) does on a
loaded machine: a test preloads it to keep a host's session busy spawning."""

import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))
