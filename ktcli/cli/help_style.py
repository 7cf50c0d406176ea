"""The type column of `--help`, as a user reads it.

typer 0.29 fills that column with a parameter's Python annotation where click showed a
word: `--help <bool>`, `PATHS... QUESTION <list[str]>`, `--top-k <int>`, and braces a
required argument's usage (`{PATHS... QUESTION}...`). Options here
name their values (`--top-k N`); this keeps flags without a value column and an argument
whose name is already its metavar from repeating it as a type. Older typer versions,
which have no such method or show click's words, are left as they are.
"""

from __future__ import annotations


def plain_type_column() -> None:
    try:
        from typer import core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is None or argument is None:
        return
    option_type = getattr(option, "display_type_rich", None)
    if option_type is None or getattr(argument, "display_type_rich", None) is None:
        return

    def option_display(self, ctx):  # type: ignore[no-untyped-def]
        if self.metavar is None and getattr(self, "is_flag", False):
            return None  # --help, --json: they take no value
        return option_type(self, ctx)

    def argument_display(self, ctx):  # type: ignore[no-untyped-def]
        return None  # its name column shows the metavar already

    option.display_type_rich = option_display
    argument.display_type_rich = argument_display

    usage_name = getattr(argument, "_usage_display_name", None)
    if usage_name is not None:
        def argument_usage(self):  # type: ignore[no-untyped-def]
            # typer 0.29 braces a required argument and adds "...": `{PATHS... QUESTION}...`
            # for a metavar that says its own shape. Shown as written.
            return self.metavar if self.metavar else usage_name(self)

        argument._usage_display_name = argument_usage
