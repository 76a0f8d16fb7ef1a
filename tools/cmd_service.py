"""``hidvfs service install|uninstall``: the systemd unit, default config and group."""

from __future__ import annotations

import click

from tools.common import Friendly, fail, not_empty


@click.group("service", cls=Friendly)
def service() -> None:
    """Install or remove hidvfs as a systemd service (needs root; --dry-run prints the plan)."""


@service.command("install")
@click.option("--dry-run", is_flag=True, help="Print the steps without changing anything.")
@click.option(
    "--prefix",
    default="/",
    show_default=True,
    callback=not_empty,
    help="Install into a staging tree (files only, no systemctl; root not needed).",
)
@click.option(
    "--exe",
    default=None,
    help="Absolute path of the hidvfs script the unit runs (default: the one on PATH here; "
    "give it when staging for another machine).",
)
def install_cmd(dry_run: bool, prefix: str, exe: str | None) -> None:
    """Install the unit and the default config (kept if present), create group hidvfs, enable
    it and (re)start it (a running daemon picks up the new unit and code)."""
    from tools.service_plan import ServiceError, install_plan, run_plan

    try:
        run_plan(install_plan(prefix=prefix, exe=exe), dry_run=dry_run, out=click.echo)
    except (PermissionError, ServiceError, ValueError) as err:
        fail(str(err))


@service.command("uninstall")
@click.option("--dry-run", is_flag=True, help="Print the steps without changing anything.")
@click.option(
    "--prefix",
    default="/",
    show_default=True,
    callback=not_empty,
    help="Staging tree used at install.",
)
def uninstall_cmd(dry_run: bool, prefix: str) -> None:
    """Stop and disable the service and remove its unit (the config and state stay)."""
    from tools.service_plan import ServiceError, run_plan, uninstall_plan

    try:
        run_plan(uninstall_plan(prefix=prefix), dry_run=dry_run, out=click.echo)
    except (PermissionError, ServiceError) as err:
        fail(str(err))


COMMAND = service
