"""`python -m pytest` alone runs a quick subset; `--full` (CI: .ci/run) runs the whole suite.

The whole suite takes 1-1.7 h on 2 cores (CI, on pytest-xdist, about 20 min): most of its
tests start JAX programs and CLI processes. Run with no path, the suite is QUICK: the unit
tests, the trust boundary's fast cases, and one end-to-end test per major path (an embedded
store cold then warm, a team store over moto and PostgreSQL, activation by ARTSTORE_URL,
named executables, bundles, `artstore warm`, pull, the tier, gc, doctor, the pytest plugin,
single-flight). Naming paths (`pytest tests/test_gc.py`), `--full`, or CI's `--jax-record`,
`--jax-only` and `--interpreter-only` run everything they select. tests/test_quick_subset.py
keeps QUICK within QUICK_MAX_TESTS and every entry of it naming a test that exists.
Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import pytest

# Node ids, or their beginnings (a file, a test with all its parameters), relative to the root.
QUICK = (
    # Units: pure functions, settings, layer rules, codecs, one process.
    "tests/test_units.py",
    "tests/test_layers.py",
    "tests/test_settings_table.py",
    "tests/test_counters.py",
    "tests/test_secrets.py::test_redact",
    "tests/test_secrets.py::test_errors_and_log_records_are_redacted",
    "tests/test_secrets.py::test_cli_failures_never_show_secrets[s3 no bucket]",
    "tests/test_roles.py",
    "tests/test_background.py",
    "tests/test_torch_xla_parts.py",
    "tests/security/test_record_kinds.py",
    "tests/security/test_working_set_validation.py",
    # The trust boundary's fast cases.
    "tests/test_signing.py::test_codec_verifies_before_inflating_and_binds_namespace_and_key",
    "tests/test_signing.py::test_forged_object_signed_by_an_untrusted_key_is_not_loaded",
    "tests/security/test_require_signatures.py::test_a_bucket_writer_alone_cannot_choose_what_a_default_reader_runs",
    "tests/security/test_writer_binding.py::test_writer_program_on_another_bucket_stores_nothing_and_says_so",
    "tests/security/test_identity.py::test_gc_on_a_wrong_empty_bucket_refuses_and_leaves_the_index",
    "tests/test_tier_security.py",
    # One end-to-end test per major path.
    "tests/test_forks.py::test_a_forked_job_computes_and_stores_as_a_fresh_one",
    "tests/test_activation.py::test_a_program_that_never_heard_of_us_hits_on_its_second_run",
    "tests/test_team_store.py::test_read_only_reader_hits_and_writes_nothing",
    "tests/test_named.py::test_fresh_process_loads_without_tracing_with_identical_results",
    "tests/test_bundles.py::test_bundle_into_a_local_store_serves_a_fresh_process",
    "tests/test_warm.py::test_warm_command_then_fresh_process_loads_everything",
    "tests/test_pull.py::test_pull_on_the_embedded_default",
    "tests/test_tier.py::test_warm_host_loads_from_its_tier_while_the_store_is_down",
    "tests/test_gc.py::test_lru_evicts_oldest_until_the_limit_holds_exactly",
    "tests/test_doctor.py::test_embedded_store_is_used_and_nothing_is_created",
    "tests/test_pytest_plugin.py::test_artstore_flag_stores_then_loads",
    "tests/test_single_flight.py::test_reader_loads_what_a_writer_compiles",
    "tests/test_cli.py::test_unreachable_index_is_one_line",
)
QUICK_MAX_TESTS = 250
FULL_OPTIONS = ("--full", "--jax-record", "--jax-only", "--interpreter-only")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("artifactstore").addoption(
        "--full", action="store_true", help="the whole suite, not the quick subset (CI)"
    )


def quick(config: pytest.Config) -> bool:
    """Whether this run is the quick subset: no path named, nothing that asks for all."""
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return False
    return not any(
        config.getoption(option.lstrip("-").replace("-", "_")) for option in FULL_OPTIONS
    )


def in_quick(nodeid: str) -> bool:
    return any(nodeid == entry or nodeid.startswith((entry + "::", entry + "[")) for entry in QUICK)


def pytest_report_header(config: pytest.Config) -> str | None:
    if quick(config):
        return "the quick subset (tests/quick_subset.py); --full runs the whole suite"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not quick(config):
        return
    config.hook.pytest_deselected(items=[i for i in items if not in_quick(i.nodeid)])
    items[:] = [i for i in items if in_quick(i.nodeid)]
