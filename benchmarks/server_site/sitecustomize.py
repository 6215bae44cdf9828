"""Put on ``PYTHONPATH`` of every vLLM server ``benchmarks/vllm_pd.py`` starts, stock
ones included; each Python process of the server (API server, engine core, workers)
imports it at start-up. Nothing of vLLM's behaviour changes.

- **AMX tiles.** It asks Linux for the AMX tile registers before vLLM's CPU attention
  uses them (``leaseproto/integrations/vllm/amx.py`` says why a worker dies of SIGILL
  without them). ``LeaseprotoConnector`` asks by itself; this gives a stock
  ``NixlConnector`` the same permission, so the two are compared on the same kernel
  and neither side's figures include a worker killed by the CPU.
- **Stacks on SIGUSR1.** ``faulthandler`` writes every thread's Python stack to the
  process's stderr (the server's log) on SIGUSR1, also while the thread is stuck in C
  code. The benchmark sends it when a request stalls (``_vllm_stall``), so the log
  says where each engine was.
"""

import faulthandler
import signal

try:
    from leaseproto.integrations.vllm.amx import request_amx_tiles

    request_amx_tiles()
except Exception:  # a process without torch (or a torch without the helper): nothing to ask
    pass

faulthandler.register(signal.SIGUSR1, all_threads=True)
