# System-wide Jupyter Server settings for the gpuspawner single-user image.
# The spawner passes --ip/--port (host networking, a free loopback port) on the command line.
c = get_config()  # noqa: F821

# Start the file browser in HOME (the mounted shared home), not in the image's WORKDIR.
import os  # noqa: E402

c.ServerApp.root_dir = os.environ.get("HOME", "/tmp")
# No browser inside a container; no terminals outside the home's shell.
c.ServerApp.open_browser = False
c.ServerApp.terminado_settings = {"shell_command": [os.environ.get("SHELL", "/bin/bash")]}
