"""Command-line flags from environment variables, by one rule: `--foo-bar` <-> `QTTS_FOO_BAR`.

A parser made with `env_prefix` (the `serve` command's) reads, for each of its flags not given on the
command line, the variable named by the prefix and the flag's long option (upper case, `-` as `_`),
converted and checked exactly as the flag's own argument. Repeatable flags (`action="append"`) take a
comma-separated list; on/off flags take 1/true/yes or 0/false/no; an empty variable counts as unset.
The command line wins: a flag given there ignores its variable (a repeatable one, all of the list).
An invalid value is a usage error naming the variable (exit 2), before anything starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no")
LIST_SEPARATOR = ","


def env_name(action: argparse.Action, prefix: str) -> str | None:
    """The variable of a flag (None for positionals and --help)."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    if not longs or action.default is argparse.SUPPRESS:
        return None
    return prefix + longs[0][2:].upper().replace("-", "_")


class EnvArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose flags fall back to environment variables when `env_prefix` is set."""

    def __init__(self, *args: Any, env_prefix: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.env_prefix = env_prefix

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        if self.env_prefix is None:
            return super().parse_known_args(args, namespace)
        namespace = namespace if namespace is not None else argparse.Namespace()
        lists: list[tuple[argparse.Action, list]] = []
        for action in self._actions:
            name = env_name(action, self.env_prefix)
            text = os.environ.get(name, "").strip() if name else ""
            if not text:
                continue
            value = self._from_environment(action, name, text)
            if isinstance(action, argparse._AppendAction):
                lists.append((action, value))  # appending would add to it: applied after the parse
            elif not hasattr(namespace, action.dest):
                setattr(namespace, action.dest, value)  # a default the command line replaces
        namespace, extras = super().parse_known_args(args, namespace)
        for action, value in lists:
            if getattr(namespace, action.dest) == action.default:  # the command line appended nothing
                setattr(namespace, action.dest, value)
        return namespace, extras

    def _from_environment(self, action: argparse.Action, name: str, text: str) -> Any:
        """The flag's value from its variable's text; a usage error (exit 2) when it is invalid."""
        if action.nargs == 0:  # an on/off switch (store_true and the like)
            if text.lower() not in TRUE + FALSE:
                self.error(f"{name}={text!r}: use one of {'/'.join(TRUE)} or {'/'.join(FALSE)}")
            return action.const if text.lower() in TRUE else action.default
        items = [item.strip() for item in text.split(LIST_SEPARATOR) if item.strip()]
        try:
            values = [self._get_value(action, item) for item in
                      (items if isinstance(action, argparse._AppendAction) else [text])]
            for value in values:
                self._check_value(action, value)
        except argparse.ArgumentError as e:
            self.error(f"{name}={text!r}: {e.message}")
        return values if isinstance(action, argparse._AppendAction) else values[0]
