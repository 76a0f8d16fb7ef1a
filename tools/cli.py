"""``hidvfs``: the command-line entry point (click). Thin: parse, call the layers, print.

Subcommands import their modules lazily so ``hidvfs --help`` and the daemon start fast.
"""

from __future__ import annotations

import sys

import click

from tools import __version__
from tools.cmd_bots import bots
from tools.cmd_daemon import daemon_cmd, run_cmd, status_cmd
from tools.cmd_platforms import boards_cmd, fake_sysfs_cmd, probe_cmd
from tools.cmd_trace import trace


class _Root(click.Group):
    """Ctrl-C (or a SIGTERM/SIGHUP a command turns into it) exits 130, the shell's code for
    an interrupt, not click's 1 ("Aborted!"), which a script cannot tell from a failed run."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:
            # a command may say what the interrupt kept (a campaign: its finished runs)
            hint = getattr(err, "hint", None)
            click.echo(f"interrupted: {hint}" if hint else "interrupted", err=True)
            ctx.exit(130)


@click.group(
    cls=_Root,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="hidvfs")
def cli() -> None:
    """hidvfs: a deadline- and temperature-aware DVFS daemon for embedded boards.

    It drives cpufreq, reads thermal zones and power rails, and decides with learned agents
    guarded by a schedulability gate and a conformal shield. Start with `hidvfs boards`,
    `hidvfs probe`, or run the whole thing on a simulated board:
    `hidvfs daemon --sim tx2 --duration 60`.
    """


cli.add_command(boards_cmd)
cli.add_command(probe_cmd)
cli.add_command(fake_sysfs_cmd)
cli.add_command(trace)
cli.add_command(daemon_cmd)
cli.add_command(status_cmd)
cli.add_command(run_cmd)
cli.add_command(bots)

for _optional in (
    "tools.cmd_agents",
    "tools.cmd_service",
    "tools.cmd_coordinator",
    "tools.cmd_profile",
):
    try:
        _mod = __import__(_optional, fromlist=["COMMAND"])
    except ImportError:  # pragma: no cover - a part not built into this checkout
        continue
    cli.add_command(_mod.COMMAND)


def main() -> None:
    try:
        cli(prog_name="hidvfs")
    except KeyboardInterrupt:  # pragma: no cover - interactive
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
