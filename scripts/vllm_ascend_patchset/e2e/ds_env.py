"""Environment variables the dual-stream e2e servers pass to their workers (``ds_worker``)."""

REPORT_DIR_ENV = "DS_E2E_REPORT_DIR"  # each worker writes rank<N>.json there after every forward
LINK_ENV = "DS_E2E_LINK"  # ALPHA_US:BETA_GBPS: all-reduces over an emulated link (dsbench.link)
