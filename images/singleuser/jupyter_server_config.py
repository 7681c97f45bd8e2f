# System-wide Jupyter Server settings for the gpuspawner single-user image.
# The spawner passes --ip/--port (host networking, a free loopback port) on the command line.
c = get_config()  # noqa: F821

# Start the file browser in HOME (the mounted shared home), not in the image's WORKDIR.
import os  # noqa: E402

c.ServerApp.root_dir = os.environ.get("HOME", "/tmp")
# No browser inside a container; no terminals outside the home's shell.
c.ServerApp.open_browser = False
c.ServerApp.terminado_settings = {"shell_command": [os.environ.get("SHELL", "/bin/bash")]}

# Notebook jobs from JupyterLab: jupyter-scheduler's UI, with every job sent to the hub's
# gpuspawner service and run there in a bundle of its own, never in this server
# (gpuspawner.singleuser.scheduler; docs/jobs.md, "From JupyterLab"). Its own tables are made
# at start but not used: in memory, not in the home.
c.SchedulerApp.scheduler_class = "gpuspawner.singleuser.scheduler.HubScheduler"
c.SchedulerApp.environment_manager_class = (
    "gpuspawner.singleuser.scheduler.HubEnvironmentManager")
c.SchedulerApp.job_files_manager_class = "gpuspawner.singleuser.scheduler.HubJobFilesManager"
c.SchedulerApp.db_url = "sqlite://"
