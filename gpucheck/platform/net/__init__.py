"""The node's RDMA network as plain data (issue 24): InfiniBand / RoCE ports from
/sys/class/infiniband or from the text of ibstat, ibstatus, ibv_devinfo and `rdma link`
(model, ports, text), the loaded kernel modules (modules), which ports are rails (rails),
recording into and replaying from a snapshot (record), and the capture kinds `gpucheck judge`
reads (captures). Readers only: nothing here judges."""
