package main

// The state file ($GPUSLICE_NVML_MOCK_STATE): what a test sets and real NVML would measure.
// Read again on every query that depends on it (a few hundred bytes of JSON), so a test changes
// the node by rewriting the file (write a temporary file and rename it over, so that no query
// reads half a file). Schema in main.go's package comment.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

type processSpec struct {
	PID     uint32  `json:"pid"`
	UsedMiB *uint64 `json:"usedMiB"` // null or absent: NVML_VALUE_NOT_AVAILABLE
	Kind    string  `json:"kind"`    // compute (default), graphics, mps, or kinds joined by "+"
	SMUtil  *uint32 `json:"smUtil"`  // absent: no utilisation sample for this process
}

type utilizationSpec struct {
	GPU    uint32 `json:"gpu"`
	Memory uint32 `json:"memory"`
}

type xidSpec struct {
	UUID string `json:"uuid"` // a GPU, or a MIG device (the event then carries its instance ids)
	XID  uint64 `json:"xid"`
}

type state struct {
	MIG         map[string][]string        `json:"mig"`
	BaselineMiB *uint64                    `json:"baselineMiB"`
	Processes   map[string][]processSpec   `json:"processes"`
	Utilization map[string]utilizationSpec `json:"utilization"`
	Lost        []string                   `json:"lost"`
	XIDs        []xidSpec                  `json:"xids"`
	NVSwitch    bool                       `json:"nvswitch"`

	stampUs uint64 // the file's modification time (µs): the time of its utilisation samples
}

func (s *state) baselineBytes() uint64 {
	if s.BaselineMiB != nil {
		return *s.BaselineMiB * mib
	}
	return defaultBaselineBytes
}

func (s *state) lost(uuid string) bool {
	for _, u := range s.Lost {
		if u == uuid {
			return true
		}
	}
	return false
}

func (p processSpec) is(kind string) bool {
	if p.Kind == "" {
		return kind == "compute"
	}
	for _, k := range strings.Split(p.Kind, "+") {
		if k == kind {
			return true
		}
	}
	return false
}

// readState reads the state file; no variable or no file: the empty state.
func readState() (*state, error) {
	path := os.Getenv("GPUSLICE_NVML_MOCK_STATE")
	s := &state{}
	if path == "" {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for uuid, list := range s.Processes {
		for _, p := range list {
			for _, k := range strings.Split(p.Kind, "+") {
				if k != "" && k != "compute" && k != "graphics" && k != "mps" {
					return nil, fmt.Errorf("%s: process %d on %s: kind %q is not compute, graphics or mps", path, p.PID, uuid, p.Kind)
				}
			}
		}
	}
	s.stampUs = uint64(info.ModTime().UnixMicro())
	return s, nil
}
