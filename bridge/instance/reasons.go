package instance

import (
	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// runtimeReasons maps what a driver says (runtimes.Reason) to the reason
// the API documents. Drivers never see the API; this table is the one
// place their words become its reasons, and
// TestEveryRuntimeReasonHasAConditionReason fails for a runtimes.Reason
// missing here.
var runtimeReasons = map[runtimes.Reason]string{
	runtimes.ReasonFailed:                v1alpha1.ReasonRuntimeError,
	runtimes.ReasonUnavailable:           v1alpha1.ReasonRuntimeUnavailable,
	runtimes.ReasonNameConflict:          v1alpha1.ReasonNameConflict,
	runtimes.ReasonImageNotFound:         v1alpha1.ReasonImageNotFound,
	runtimes.ReasonNotFound:              v1alpha1.ReasonInstanceNotFound,
	runtimes.ReasonRefused:               v1alpha1.ReasonCommandRefused,
	runtimes.ReasonMountSourceMissing:    v1alpha1.ReasonMountSourceMissing,
	runtimes.ReasonIdmapNotPermitted:     v1alpha1.ReasonIdmapNotPermitted,
	runtimes.ReasonHostDisksNotPermitted: v1alpha1.ReasonHostDisksNotPermitted,
	runtimes.ReasonHardeningNotPermitted: v1alpha1.ReasonHardeningNotPermitted,
	runtimes.ReasonLimitsUnavailable:     v1alpha1.ReasonLimitsUnavailable,
	runtimes.ReasonHealthy:               v1alpha1.ReasonHealthy,
	runtimes.ReasonSnapshotMissing:       v1alpha1.ReasonSnapshotMissing,
	runtimes.ReasonNotMounted:            v1alpha1.ReasonNotMounted,
	runtimes.ReasonUpperDirOverLimit:     v1alpha1.ReasonUpperDirOverLimit,
	runtimes.ReasonSizeLimitNotEnforced:  v1alpha1.ReasonSizeLimitNotEnforced,
}

// Reason is the API's reason for a driver's: a condition reason, and the
// status reason of the exec API. One the table lacks (which its test
// prevents) reads as RuntimeError.
func Reason(r runtimes.Reason) string {
	if s, ok := runtimeReasons[r]; ok {
		return s
	}
	return v1alpha1.ReasonRuntimeError
}

// ErrorReason is the API's reason for a driver's error (runtimes.ReasonOf).
func ErrorReason(err error) string { return Reason(runtimes.ReasonOf(err)) }
