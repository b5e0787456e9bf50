"""The documented extras installed as a user installs them: fresh venvs, unpinned, from the
package index (GBs of PyTorch, minutes). Run only when selected (`-m docs_install`: the rule
is tests/suite_rules.ON_REQUEST), never by the README's test command or CI's other phases."""
