"""``%load_ext gpuspawner.kernel``: the name users type; the code is
:mod:`gpuspawner.singleuser.kernel`."""

from .singleuser.kernel import *  # noqa: F401,F403
from .singleuser.kernel import load_ipython_extension, unload_ipython_extension  # noqa: F401
