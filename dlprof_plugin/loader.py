"""TensorBoard entry point (`tensorboard_plugins` group, name `dlprof`): loads the DLPROF plugin lazily."""

from __future__ import annotations

import logging

from tensorboard.plugins import base_plugin


class DLProfLoader(base_plugin.TBLoader):
    """Creates the plugin; its modules (and sqlite3 work) are imported only when TensorBoard loads it."""

    def define_flags(self, parser):
        group = parser.add_argument_group("dlprof")
        group.add_argument(
            "--dlprof_allowed_hosts",
            metavar="NAMES",
            default="",
            help="DLPROF tab: host names (comma-separated) it answers besides localhost and IP "
            "addresses when TensorBoard listens on localhost, e.g. the name of a reverse "
            "proxy; requests naming any other host are refused (DNS rebinding)",
        )

    def load(self, context):
        try:
            from dlprof_plugin.plugin import DLProfPlugin
        except ImportError as exc:  # a broken install should not take TensorBoard down
            logging.getLogger("dlprof_plugin").warning("DLPROF plugin disabled: %s", exc)
            return None
        return DLProfPlugin(context)
