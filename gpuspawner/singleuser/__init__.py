"""The single-user side, inside each user's server: the jupyter_server extension
(``gpuviews``: the session's GPUs over REST) and the IPython kernel extension (``kernel``)."""
