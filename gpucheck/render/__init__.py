"""What an operator sees on a terminal: the run grid, the sweep grid, the nccl-tests table,
`telemetry show`, and progress lines without a terminal.

`grid` and `folding` are pure data (no rich); the renderers import rich only when they print.
Every rich console comes from `console.make_console`: no markup, no emoji and no highlighting
are ever applied to data (a PCI bus id `0000:ab:00.0` stays as it is, `[bold]` in a node name
prints as typed); styles are set on `rich.text.Text` spans, never written as markup.
"""
