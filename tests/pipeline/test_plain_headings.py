from ktcli.pipeline import prompts


def test_markdown_headings_lose_their_marks_code_keeps_its_comments():
    # with "## NAME" the bundled model wrote "## Contents\n\n## 1. What is ls? ..." (probe 125)
    text = "# LS(1)\nUser Commands\n\n## NAME\nls - list\n\n```sh\n# a comment\nls -S\n```\n\n### Sub part\n#hashtag\n"
    assert prompts.plain_headings(text) == (
        "LS(1)\nUser Commands\n\nNAME\nls - list\n\n```sh\n# a comment\nls -S\n```\n\nSub part\n#hashtag\n")
    assert prompts.plain_headings("no headings here") == "no headings here"


def test_a_summary_reads_prose_headings_plain_and_code_as_written(tmp_path):
    from ktcli.config import Settings
    from ktcli.pipeline.events import NullReporter
    from ktcli.pipeline.prepare import prepare
    from ktcli.pipeline.summarize import _text

    (tmp_path / "notes.md").write_text("# Notes\n\nThe pump is serviced monthly.\n\n## Costs\n\nIt costs 40 euros.\n")
    (tmp_path / "tool.py").write_text("# Tool\n\ndef run():\n    # the pump\n    return 1\n")
    prep = prepare([str(tmp_path)], "", "summarize", Settings(), NullReporter())
    texts = {d.path.rsplit("/", 1)[-1]: _text(prep, d) for d in prep.corpus.documents}
    assert texts["notes.md"].startswith("Notes\n") and "\nCosts\n" in texts["notes.md"]
    assert texts["tool.py"].startswith("# Tool\n") and "    # the pump" in texts["tool.py"]
