package gpu

import (
	"context"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/proto/gpudiag"
)

// Names of the built-in check's tests (gpudiag.Failure.Test).
const (
	CheckEnumerate      = "enumerate"
	CheckRecoveryAction = "recovery-action"
	CheckECC            = "ecc-uncorrected"
)

// Check is the built-in NVML check that stands in for DCGM's diagnostic
// before a GPU returns to service (docs/remediation.md, "Diagnostic before
// return"): every GPU NVML counts must open and give its UUID, read its
// recovery action (NVML field FI_DEV_GET_GPU_RECOVERY_ACTION) as none, and
// read 0 in its volatile uncorrected ECC count — NVML's volatile counts start
// at 0 when the driver loads and when the GPU is reset, so an uncorrectable
// error counted there came after the repair. uuid, when not empty, must be
// among the GPUs. It reads NVML afresh and touches none of Collect's health
// state, so a check never takes a finding from the next scan. An error means
// the check could not run (ctx done, NVML not initialised): a node without
// an NVIDIA driver or without GPUs fails the check rather than erring.
func (c *Collector) Check(ctx context.Context, uuid string) (gpudiag.Result, error) {
	res := gpudiag.Result{Tool: gpudiag.ToolNVML}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("gpu check: %w", err)
	}
	ret := c.nvml.Init()
	if status, ok := unavailable(ret); ok {
		res.Tests++
		res.Add(gpudiag.Failure{Test: CheckEnumerate, Message: status})
		return res, nil
	}
	if ret != nvml.SUCCESS {
		return res, fmt.Errorf("gpu check: init nvml: %w", ret)
	}
	defer c.shutdown(ctx)
	n, ret := c.nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return res, fmt.Errorf("gpu check: count devices: %w", ret)
	}
	if n == 0 {
		res.Tests++
		res.Add(gpudiag.Failure{Test: CheckEnumerate, Message: "NVML found no NVIDIA GPUs"})
		return res, nil
	}
	found := uuid == ""
	for i := range n {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("gpu check: %w", err)
		}
		res.Tests += 3
		id := fmt.Sprint(i)
		dev, ret := c.nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			res.Add(gpudiag.Failure{Test: CheckEnumerate, GPU: id, Message: "NVML cannot open GPU index " + id + ": " + ret.Error()})
			continue
		}
		var g GPU
		var r reader
		readDevice(dev, &g, &r)
		if g.UUID == "" || r.lost {
			why := strings.Join(r.errs, "; ")
			if r.lost {
				why = "ERROR_GPU_IS_LOST"
			}
			res.Add(gpudiag.Failure{Test: CheckEnumerate, GPU: id, Message: "NVML gives no UUID for GPU index " + id + ": " + why})
			continue
		}
		id = g.UUID
		found = found || g.UUID == uuid
		if g.RecoveryAction != "" {
			res.Add(gpudiag.Failure{Test: CheckRecoveryAction, GPU: id, Message: "the driver asks for recovery action " + g.RecoveryAction})
		}
		if e := g.ECC; e != nil && e.VolatileUncorrected != nil && *e.VolatileUncorrected > 0 {
			res.Add(gpudiag.Failure{Test: CheckECC, GPU: id,
				Message: fmt.Sprintf("%d uncorrectable ECC errors since the driver loaded or the GPU was reset", *e.VolatileUncorrected)})
		}
	}
	if !found {
		res.Add(gpudiag.Failure{Test: CheckEnumerate, GPU: uuid, Message: "NVML does not list GPU " + uuid})
	}
	return res, nil
}
