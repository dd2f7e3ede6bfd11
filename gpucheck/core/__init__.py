"""The core: what a check is and what becomes of its results, with no check, no fleet code and no
compute backend in it.

- `check`     the check contract: define(), CheckSpec, Level, Need, Context, RunOptions
- `options`   a check's own options: option(), Option (what `gpucheck burn --size` gives one check)
- `result`    Result, Rule, evaluate(): rules (data) over metrics -> status, action, summary
- `runner`    runs the checks: one supervised execution per check
- `verdict`   the node's verdict document and its exit code
- `config`    the site's TOML config and the limits of every setting
- `state`     the history and the state directory
- `inject`    --inject KIND:... fault injection, parsed once
- `choices`   comma lists of names (`--dtype bf16,fp16`)
"""
