"""TensorBoard entry point (`tensorboard_plugins` group, name `dlprof`): loads the DLPROF plugin lazily."""
from __future__ import annotations

from tensorboard.plugins import base_plugin


class DLProfLoader(base_plugin.TBLoader):
    """Creates the plugin; its modules (and sqlite3 work) are imported only when TensorBoard loads it."""

    def load(self, context):
        try:
            from dlprof_plugin.plugin import DLProfPlugin
        except ImportError as exc:  # a broken install should not take TensorBoard down
            import logging
            logging.getLogger("dlprof_plugin").warning("DLPROF plugin disabled: %s", exc)
            return None
        return DLProfPlugin(context)
