"""Jupyter server configuration of the galata UI tests (labextension/ui-tests).

!! Never use this configuration in production: galata's configure_jupyter_server removes the
token and the XSRF check and exposes the JupyterLab application in the page.

On top of galata's defaults:
- loopback only, on $GALATA_PORT (playwright.config.js starts one server per project);
- this checkout's prebuilt extension (gpuspawner/labextension_static, scripts/build-labextension.sh)
  comes first on the labextensions path, before any copy in the venv's share/jupyter;
- the gpuviews server extension is enabled (its NVML comes from $GPUSPAWNER_NVML_FACTORY, the
  test double in tests/test_gpuviews_nvml.py, set by playwright.config.js);
- no news or update checks (no network).
"""

import os
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "gpuspawner" / "labextension_static"

c.ServerApp.ip = "127.0.0.1"  # noqa: F821
c.ServerApp.port = int(os.environ.get("GALATA_PORT", "18888"))  # noqa: F821
c.ServerApp.jpserver_extensions = {"gpuspawner.singleuser.gpuviews": True}  # noqa: F821
c.LabApp.news_url = None  # noqa: F821
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"  # noqa: F821

# the first labextensions directory holding an extension wins
_ext_dir = Path(tempfile.mkdtemp(prefix="gpuspawner-labext-"))
(_ext_dir / "gpuspawner-labextension").symlink_to(BUILT, target_is_directory=True)
_galata = c.LabServerApp.extra_labextensions_path  # noqa: F821
c.LabServerApp.extra_labextensions_path = [  # noqa: F821
    str(_ext_dir), *([_galata] if isinstance(_galata, str) else list(_galata))]
