"""Finding the user code a setting names by import path (``model.reward.fn: my_rewards:score``).

- :mod:`~lit_entropy.extensions.imports`: import ``pkg.module:function`` from ``sys.path`` or, as ``python -m``
  does, from the working directory, with one-line errors naming the setting.
"""

from lit_entropy.extensions.imports import import_module_here, import_object, split_import_path

__all__ = ["import_module_here", "import_object", "split_import_path"]
