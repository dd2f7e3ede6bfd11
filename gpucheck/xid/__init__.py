"""The Xid engine: the catalog of Xid/SXid codes and the judge that turns the kernel log's events
(read by gpucheck.platform.kernlog) into results. The `xid` check (gpucheck.tests_suite.xid) and
`gpucheck xid` drive it."""
