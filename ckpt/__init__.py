"""``ckpt``: the command line of ckpt-ownership (``ckpt audit``, ``ckpt conformance``);
``cli`` holds it."""
