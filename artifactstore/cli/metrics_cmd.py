"""`artstore metrics`: the index's gauges in Prometheus's text format, for a textfile collector.

A documented interface, used by scripts outside this repository: it prints the exposition
format on stdout and nothing else, reads only the index (never the object store), and needs
the `metrics` extra (prometheus-client), whose absence is one line naming the install.
"""

from __future__ import annotations

import click

from artifactstore.cli.context import EXIT_USAGE, Ctx, fail


@click.command("metrics")
@click.option("--all-namespaces", is_flag=True, help="Every namespace in the index.")
@click.option(
    "--multiprocess-dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Also the counters of the processes that wrote to DIR (their "
    "PROMETHEUS_MULTIPROC_DIR), added up.",
)
@click.pass_obj
def metrics_cmd(obj: Ctx, all_namespaces: bool, multiprocess_dir: str | None) -> None:
    """Index gauges in Prometheus text format: entries, bytes, objects, quota use, oldest
    access age and the index's event counters, per namespace (for node_exporter's textfile
    collector: `artstore metrics > DIR/artstore.prom.$$ && mv ... DIR/artstore.prom`)."""
    import os

    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        from artifactstore.metrics import INSTALL_HINT

        fail(f"artstore metrics needs prometheus-client: {INSTALL_HINT}")
    if multiprocess_dir is not None and not os.path.isdir(multiprocess_dir):
        fail(f"--multiprocess-dir {multiprocess_dir!r} is not a directory", EXIT_USAGE)
    from artifactstore.index.figures import namespace_figures
    from artifactstore.index.quotas import namespaces
    from artifactstore.metrics import exposition
    from artifactstore.store import open_index, secure_local_dirs

    settings = obj.settings()
    secure_local_dirs(settings)
    engine = open_index(settings)
    try:
        targets = namespaces(engine) if all_namespaces else [settings.namespace]
        figures = namespace_figures(engine, targets)
    finally:
        engine.dispose()
    click.echo(exposition(figures, multiprocess_dir).decode(), nl=False)
