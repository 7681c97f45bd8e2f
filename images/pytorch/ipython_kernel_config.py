# Every IPython kernel of the PyTorch image (IPython reads {sys.prefix}/etc/ipython/ for all
# users): PyTorch holds itself to the server's GPU share. The extension imports no torch; it
# waits for the notebook's own `import torch` (gpuspawner/singleuser/torchshare.py).
c = get_config()  # noqa: F821
c.InteractiveShellApp.extensions.append("gpuspawner.singleuser.torchshare")
