"""pytest-jupyter's jupyter_server fixtures, with its event-loop hooks, for this folder only.

Named in a test module's ``pytest_plugins`` they would be registered for the rest of the
session, and their autouse asyncio loop would wrap every later test on that worker
(Playwright's sync API then fails at teardown). Imported here, they stay in this folder.
"""

from pytest_jupyter.jupyter_server import *  # noqa: F403

from tests.support.lab_server import ext_fetch, gpu_env, jp_server_config  # noqa: F401
