"""Results JSON -> docs/benchmarks.md, one module per block of the page.

`page` renders the whole page (and splices one block's section into it for `--only`); `targets`, `shape`
(a model's section), `busy`, `memory`, `overlap`, `codec`, `first_audio`, `stages` and `peers` each render their
section;
`format`, `results` and `goals` hold what several sections share: how a figure is written, readings of
the results JSON, and the goals of the issue *Real-time CPU*.
"""
