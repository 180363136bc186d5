"""Every figure the notebooks and the report draw: the sweeps (``sweeps``), the host path
(``host``), the thread layout of a row (``layout``), the backward's data flow (``flow``) and the
GPUs side by side (``gpus``). Series are drawn in the registry's colours and line styles."""
