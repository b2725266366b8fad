"""The IPython profile of dataref kernels.

``startup/00-dataref.py`` runs when a kernel starts; its parts are the modules of
``startup/lib/`` (inputs, collect, protocol, frames, convert, memory, transfer), which it loads
by path, so none is importable or replaceable through ``sys.path``. The pool binds this package's
``startup`` directory read-only into the sandbox, so the agent cannot change what runs at the
next start. It is found at run time with ``importlib.resources.files("dataref.kernel_profile")``.
"""
