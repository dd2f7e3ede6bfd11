"""The Xid catalog: data, not code.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the Ampere-and-newer
catalog, Xids 1-172), and the mnemonics of the driver's nverror.h. Each row keeps NVIDIA's
mnemonic, description and the two resolution buckets (immediate and investigatory action).

gpucheck's own judgement is two more columns, derived from the immediate bucket by
`BUCKET_VERDICT` and changed for single Xids by `OVERRIDES` (each with the reason):

  severity  critical   the node must not take work: the check fails with `action`
            warning    the check warns (a person should look, the node may keep working)
            app        application-class: the job that hit it died, the GPU is fine; the check
                       passes unless the same Xid repeats on one GPU beyond `repeat_limit`
            info       informational: shown, never changes the verdict
  action    a gpucheck.core.result.Action value: none, investigate, restart-app, reset-gpu,
            reboot, drain, rma

Unknown numbers are never dropped: `lookup()` returns an "unknown Xid N" entry (warning,
investigate).
"""

from __future__ import annotations

from dataclasses import dataclass

# (xid, mnemonic, description, immediate bucket, investigatory bucket)
XID_ROWS: tuple[tuple[int, str, str, str, str], ...] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT"),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP", "CHECK_APP/CUDA"),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13"),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Fake or injected error from userspace", "IGNORE", "CONTACT_SUPPORT"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", "CHECK_APP/CUDA"),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP", "CHECK_APP/CUDA"),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE", "CHECK_APP/CUDA"),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", "CONTACT_SUPPORT"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (application fault, GPU healthy)", "IGNORE", "CONTACT_SUPPORT"),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE", "CONTACT_SUPPORT"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", "Solo: RESTART_FM; not solo: IGNORE (follow the other Xid)"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "CONTACT_SUPPORT"),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", "INVESTIGATE_SW"),
    (61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU", "CONTACT_SUPPORT"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event (row remap / page retirement)", "IGNORE", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE", "INVESTIGATE_SW"),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", "CONTACT_SUPPORT"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", "CHECK_APP/CUDA"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (74, "NVLINK_ERROR", "NVLink Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "UPDATE_SWFW"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", "CHECK_APP/CUDA"),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE", "CONTACT_SUPPORT"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "IGNORE (sympathetic)"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "IGNORE"),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "IGNORE"),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", "XID_137_FLOW"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "INVESTIGATE_SW"),
    (111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    (121, "C2C_ERROR", "C2C Error (corrected, link to Grace CPU)", "IGNORE", "CONTACT_SUPPORT"),
    (122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (136, "ALI_TRAINING_FAIL", "NVLink link training failed", "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error (illegal peer access)", "IGNORE", "XID_137_FLOW"),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error (escaped row remapping / page offlining)", "RESET_GPU", "CONTACT_SUPPORT"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "CONTACT_SUPPORT"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", ""),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "NVLINK_SAW_ERROR", "NVLink: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLink: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLink: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLink: TREX Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "NVLink: NETIR Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLink: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", "CONTACT_SUPPORT"),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "CONTACT_SUPPORT"),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "CONTACT_SUPPORT"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", "N/A (informational, regarding another Xid)"),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLink: SW Defined Error (intentional link down)", "RESET_GPU", "INVESTIGATE_SW_USER"),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "IGNORE"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", "CONTACT_SUPPORT"),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", "INVESTIGATE_SW"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "INVESTIGATE_SW"),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", ""),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", ""),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", ""),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", ""),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic seen before the link was configured for encrypted traffic", "", ""),
    (167, "PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", "", ""),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", ""),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt (SEC2)", "", ""),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", ""),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM error (details of an Xid 48)", "", ""),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM error (details of an Xid 48)", "", ""),
)

# Immediate-action bucket -> (gpucheck severity, action).
BUCKET_VERDICT: dict[str, tuple[str, str]] = {
    "RESTART_APP": ("app", "restart-app"),
    "RESET_GPU": ("critical", "reset-gpu"),
    "RESTART_BM": ("critical", "reboot"),
    "RESTART_VM": ("critical", "reboot"),
    "IGNORE": ("info", "none"),
    # NVIDIA marks the codes no current GPU emits CONTACT_SUPPORT ("Unused"): seeing one is odd.
    "CONTACT_SUPPORT": ("warning", "investigate"),
    "CHECK_MECHANICALS": ("critical", "drain"),
    "UPDATE_SWFW": ("warning", "investigate"),
    "CHECK_UVM": ("warning", "investigate"),
    "WORKFLOW_XID_45": ("info", "none"),
    "WORKFLOW_XID_48": ("critical", "reset-gpu"),
    "WORKFLOW_NVLINK_ERR": ("critical", "reset-gpu"),
    "WORKFLOW_NVLINK5_ERR": ("critical", "reset-gpu"),
    "XID_154": ("warning", "investigate"),  # replaced by the action read from the message
    "": ("warning", "investigate"),  # no bucket published yet
}

# gpucheck's decisions that differ from the bucket default, each with its reason.
OVERRIDES: dict[int, dict[str, str]] = {
    13: {"note": "usually an application fault (out-of-bounds access); repeats on one GPU -> investigate"},
    31: {"note": "usually an application fault (illegal address); repeats on one GPU -> investigate"},
    45: {"note": "consequence of another error: follow the other Xid"},
    48: {"note": "uncorrectable ECC: reset the GPU; with Xid 63/64 (row-remap activity) drain and reset"},
    63: {"note": "a row was remapped; the ecc/remap checks judge pending and failed remaps"},
    74: {"note": "NVLink error; a GPU reset or node reboot clears it; the fault may be at the remote end"},
    79: {"note": "the GPU is gone from PCIe: reboot (cold boot) the node; repeats -> hardware"},
    92: {"severity": "warning", "action": "investigate",
         "note": "NVIDIA: IGNORE; gpucheck warns: a high single-bit ECC rate is worth a look"},
    94: {"severity": "warning", "action": "restart-app",
         "note": "contained to one application: restart it; reset the GPU when convenient"},
    157: {"severity": "warning", "action": "investigate",
          "note": "no spare resources left to retire; the same Xid may come back"},
    161: {"severity": "warning", "action": "investigate", "note": "channel retirement failed"},
    162: {"severity": "info", "action": "none", "note": "power smoothing is working again"},
    167: {"severity": "critical", "action": "reset-gpu",
          "note": "no published bucket; a fatal PCIe timeout is treated like Xid 158 (GPU Fatal Timeout)"},
    169: {"severity": "critical", "action": "reset-gpu",
          "note": "no published bucket; a micro-controller halt is treated like Xid 62 (PMU halt)"},
    171: {"severity": "critical", "action": "reset-gpu", "note": "accompanies Xid 48 (DRAM)"},
    172: {"severity": "critical", "action": "reset-gpu", "note": "accompanies Xid 48 (SRAM)"},
}

# Xids 144-150 (NVLink5) say "Fatal" or "Nonfatal" in the message. A fatal one takes the row's
# verdict; a non-fatal one this one (NVIDIA's table sends most non-fatal sub-codes to IGNORE or
# to the accompanying Xid 154).
NVLINK5_XIDS = frozenset(range(144, 151))
NVLINK5_NONFATAL = ("warning", "investigate")

# Xid 154: the driver's new recovery action, by the label in "... to 0x2 (Node Reboot Required)",
# or by the code when the label is unknown (NVML's nvmlDeviceGpuRecoveryAction_t values).
RECOVERY_ACTIONS: dict[str, tuple[str, str]] = {
    "none": ("info", "none"),
    "gpu reset required": ("critical", "reset-gpu"),
    "pf flr": ("critical", "reset-gpu"),
    "node reboot required": ("critical", "reboot"),
    "drain p2p": ("critical", "drain"),
    "drain and reset": ("critical", "drain"),
    "recover imex domain": ("critical", "drain"),
    "bus reset": ("critical", "reset-gpu"),
    "system reboot": ("critical", "reboot"),
}
RECOVERY_CODES: dict[int, str] = {
    0: "none",
    1: "gpu reset required",
    2: "node reboot required",
    3: "drain p2p",
    4: "drain and reset",
    5: "recover imex domain",
    6: "bus reset",
    7: "system reboot",
}

# Xids that change the action of another Xid seen on the same GPU in the same window.
CO_OCCURRENCE: tuple[dict[str, object], ...] = (
    {"xid": 48, "with": frozenset({63, 64}), "action": "drain",
     "note": "double-bit ECC error with row-remap activity: drain the node and reset the GPU"},
)

# NVSwitch SXids: the message says Fatal or Non-fatal (Fabric Manager user guide). A fatal SXid
# needs the baseboard's GPUs and NVSwitches reset, in practice a reboot.
SXID_FATAL = ("critical", "reboot")
SXID_NONFATAL = ("app", "none")  # counted; repeats beyond repeat_limit warn "investigate"
SXID_UNKNOWN = ("warning", "investigate")  # a continuation line without its header

# Fault signatures the driver prints without an Xid number (parse.SIGNATURE_RES), from real logs:
# name -> (severity, action, description, note). Each makes the GPU unusable until acted on.
SIGNATURES: dict[str, tuple[str, str, str, str]] = {
    "reset_required": ("critical", "reset-gpu", "GPU needs a reset (NV_ERR_RESET_REQUIRED, no Xid)",
                       "the driver refuses work on this GPU until it is reset: CUDA reports the device busy "
                       "or unavailable"),
    "gpu_lost": ("critical", "reboot", "GPU lost from the bus (NV_ERR_GPU_IS_LOST, no Xid)",
                 "the driver lost the GPU like an Xid 79: reboot (cold boot) the node; repeats -> hardware"),
    "gsp_heartbeat_timeout": ("critical", "reset-gpu", "GSP heartbeat timed out (no Xid)",
                              "the GPU's firmware (GSP) stopped answering: reset the GPU; repeats -> investigate "
                              "driver and firmware"),
    "gsp_rpc_timeout": ("critical", "reset-gpu", "GSP RPC timeout (GSP Timeout banner)",
                        "what Xid 119 reports; the banner counts on its own because it names no PCI address "
                        "(the Xid 119 line, when printed, is counted for its GPU too)"),
    "init_failed": ("critical", "reboot", "the driver could not initialise the GPU (RmInitAdapter failed)",
                    "the GPU is unusable since the driver loaded: reboot; if it persists, investigate "
                    "(GSP firmware, power, hardware)"),
}

SEVERITIES = ("critical", "warning", "app", "info")


@dataclass(frozen=True)
class Entry:
    xid: int
    mnemonic: str
    description: str
    bucket: str
    investigatory: str
    severity: str
    action: str
    note: str = ""
    known: bool = True

    @property
    def name(self) -> str:
        return self.mnemonic


def _build() -> dict[int, Entry]:
    table: dict[int, Entry] = {}
    for xid, mnemonic, desc, bucket, investigatory in XID_ROWS:
        severity, action = BUCKET_VERDICT[bucket]
        over = OVERRIDES.get(xid, {})
        table[xid] = Entry(
            xid=xid,
            mnemonic=mnemonic,
            description=desc,
            bucket=bucket,
            investigatory=investigatory,
            severity=over.get("severity", severity),
            action=over.get("action", action),
            note=over.get("note", ""),
        )
    return table


CATALOG: dict[int, Entry] = _build()


def lookup(xid: int) -> Entry:
    entry = CATALOG.get(xid)
    if entry is not None:
        return entry
    return Entry(
        xid=xid,
        mnemonic=f"unknown Xid {xid}",
        description=f"unknown Xid {xid} (not in gpucheck's catalog)",
        bucket="",
        investigatory="",
        severity="warning",
        action="investigate",
        note="not in NVIDIA's catalog as gpucheck knows it: look it up for this driver",
        known=False,
    )
