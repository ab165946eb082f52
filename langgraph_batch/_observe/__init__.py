"""Observation: what the scheduler, fan_out and the tools report, and where it goes.

    sinks       the one seam: the library calls `sinks.call`, `sinks.sibling`, ...
                and every subscribed `Sink` gets the event (free with none)
    tracing     OpenTelemetry spans for scheduled calls and coalesced tools
    progress    fan_out's progress events on the custom stream, and the bar
                that draws them (`render_progress`, exported at the top level)

The Prometheus sink is the public `langgraph_batch.metrics`. It stays outside
this package on purpose: it reads the scheduler and the tools at scrape time,
while they feed the modules here, so it sits above them and this package below
(`tests/unit/test_module_graph.py` keeps the layers free of circles).
"""
