"""`edgefleet demo`: the whole system on one machine, scored against the truth of its scenes.

`cli` is the command; `steps` and `startup` bring the stack up (`stack`: broker, cloud and
agents as processes, `agent`: an agent that keeps a record), `supervisor` restarts what dies,
`chaos` and `proxy` break it on purpose, `ledger`, `report` and `cloud_only` score it.
`scenes` renders what the cameras see, for the demo (`video`, `cache`) and the benchmarks.
"""
