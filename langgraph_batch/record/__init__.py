"""Record the shape of a real run, to replay it anywhere (`langgraph-batch bench --replay`).

`Recorder` is a LangChain callback handler: pass it in a run's config and it
writes, as JSON Lines, per sibling and turn: prompt, cached and output tokens,
the structure of prefix sharing (keyed digests and lengths of the messages,
never their text unless asked), the tool calls made and each tool run's
latency, with timestamps. `read_recording` parses such a file. The format,
field by field with units, is in `langgraph_batch.record._format`.
`import_trace` reads traces in other formats (Mooncake, kvtrace, TraceLab's
replay CSV) as a `Recording` of the same shape (`_import`).

```python
from langgraph_batch.record import Recorder

async with Recorder("job.jsonl") as rec:
    await graph.ainvoke(inputs, config={"callbacks": [rec]})
```
"""

from __future__ import annotations

from langgraph_batch.record._format import (
    FORMAT,
    FORMAT_VERSION,
    LLMCall,
    Recording,
    ToolRun,
    read_recording,
)
from langgraph_batch.record._format import shared_prefix as shared_prefix
from langgraph_batch.record._import import TRACE_FORMATS as TRACE_FORMATS
from langgraph_batch.record._import import TraceFormat as TraceFormat
from langgraph_batch.record._import import import_trace
from langgraph_batch.record._recorder import Recorder

# Also importable from here, for the library's other packages (`bench --replay`), and not part of
# `__all__` (no user API): shared_prefix, TRACE_FORMATS, TraceFormat.
__all__ = (
    "FORMAT",
    "FORMAT_VERSION",
    "LLMCall",
    "Recorder",
    "Recording",
    "ToolRun",
    "import_trace",
    "read_recording",
)
