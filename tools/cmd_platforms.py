"""``hidvfs boards``, ``hidvfs probe``, ``hidvfs fake-sysfs``."""

from __future__ import annotations

import click

from tools.common import emit_json, ensure_parent, guard_errors, trusted_sysfs_root


@click.command("boards")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@guard_errors
def boards_cmd(as_json: bool) -> None:
    """List the boards hidvfs ships a spec for, with their clusters and frequency counts."""
    from platforms.spec import board_names, load_board

    rows = []
    for name in board_names():
        b = load_board(name)
        rows.append(
            {
                "name": b.name,
                "title": b.title,
                "cpus": b.ncpus,
                "clusters": [
                    {
                        "name": c.name,
                        "policy": c.policy,
                        "cpus": list(c.cpus),
                        "core_type": c.core_type,
                        "frequencies": len(c.freqs_khz),
                        "min_khz": c.fmin_khz,
                        "max_khz": c.fmax_khz,
                    }
                    for c in b.clusters
                ],
                "zones": len(b.zones),
                "rails": [r.name for r in b.rails],
            }
        )
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['name']:<10} {r['title']} ({r['cpus']} CPUs)")
        for c in r["clusters"]:
            cpus = ",".join(map(str, c["cpus"]))
            click.echo(
                f"    policy{c['policy']:<3} {c['name']:<9} {c['core_type']:<13} cpus {cpus:<9} "
                f"{c['frequencies']:>2} OPPs {c['min_khz'] // 1000}-{c['max_khz'] // 1000} MHz"
            )
        rails = ", ".join(r["rails"]) or "none (energy unavailable)"
        click.echo(f"    {r['zones']} thermal zones; power rails: {rails}")


@click.command("probe")
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    callback=trusted_sysfs_root,
    help="Root of the tree to probe: / for this machine, or a fake tree made by `hidvfs fake-sysfs`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@guard_errors
def probe_cmd(sysfs_root: str, as_json: bool) -> None:
    """Detect the board and show what hidvfs can read and write on it.

    Prints every cpufreq policy (CPUs, frequency table, governors), thermal zone and power rail,
    and which files are writable. An unknown board is described by discovery.
    """
    from platforms.probe import format_probe, probe
    from platforms.sysfs import DirSysfs

    result = probe(DirSysfs(sysfs_root))
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(format_probe(result))


@click.command("fake-sysfs")
@click.argument("board")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--mode",
    type=click.Choice(["all-online", "default"]),
    default="all-online",
    show_default=True,
    help="all-online: every CPU up; default: the board's default power mode (e.g. TX2 Denver off).",
)
@click.option("--no-quirks", is_flag=True, help="Leave out the board's sensor quirks.")
@guard_errors
def fake_sysfs_cmd(board: str, directory: str, mode: str, no_quirks: bool) -> None:
    """Write a realistic fake sysfs tree for BOARD into DIRECTORY (for tests and trying things).

    Then: `hidvfs probe --sysfs-root DIRECTORY` or `hidvfs daemon --sysfs-root DIRECTORY`.
    """
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board

    spec = load_board(board)
    # its parent made, or DIRECTORY refused, in one line naming it (not the first file the
    # tree would have failed on)
    ensure_parent("DIRECTORY", directory, folder=True)
    write_fake_tree(spec, directory, mode=mode, quirks=not no_quirks)
    click.echo(f"wrote a fake {board} tree to {directory}")
