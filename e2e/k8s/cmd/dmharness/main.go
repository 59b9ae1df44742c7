// Command dmharness runs the real kubelet device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
// outside a kubelet, so gpuslice's tests can drive it: device plugins register on its kubelet.sock over real
// gRPC, and a small loopback HTTP API admits pods (kubelet's Allocate for every container, in kubelet's order),
// releases them and reports capacity; kubelet's PodResources server reports what they hold. Pods survive a restart of the harness through a state file, the way
// kubelet gets its pods back from the API server after it restarts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newManagerImpl is the device manager's constructor that takes the registration socket's path; the exported
// NewManagerImpl hard-codes /var/lib/kubelet/device-plugins/kubelet.sock, which would need root, clobber a real
// kubelet's directory and forbid parallel tests. The signature is that of k8s.io/kubernetes v1.37.2 (pinned in
// go.mod): re-check it with `go doc -u -src` whenever go.mod moves.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node,
	store topologymanager.Store) (*devicemanager.ManagerImpl, error)

// allReady is kubelet's SourcesReady once every pod source has been seen: the manager may then free the devices
// of pods that are no longer active.
type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type harness struct {
	admitMu   sync.Mutex // kubelet admits one pod at a time
	podsMu    sync.RWMutex
	pods      map[types.UID]*v1.Pod // the active pods; read by the manager through activePods
	dm        *devicemanager.ManagerImpl
	log       klog.Logger
	stateFile string
}

func (h *harness) activePods() []*v1.Pod {
	h.podsMu.RLock()
	defer h.podsMu.RUnlock()
	out := make([]*v1.Pod, 0, len(h.pods))
	for _, p := range h.pods {
		out = append(out, p)
	}
	return out
}

func (h *harness) setPod(uid types.UID, pod *v1.Pod) {
	h.podsMu.Lock()
	defer h.podsMu.Unlock()
	if pod == nil {
		delete(h.pods, uid)
	} else {
		h.pods[uid] = pod
	}
}

// saveState writes the active pods atomically, so a restarted harness admits them again as kubelet would.
func (h *harness) saveState() error {
	if h.stateFile == "" {
		return nil
	}
	pods := h.activePods()
	sort.Slice(pods, func(i, j int) bool { return pods[i].UID < pods[j].UID })
	data, err := json.Marshal(pods)
	if err != nil {
		return err
	}
	tmp := h.stateFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, h.stateFile)
}

func (h *harness) loadState() ([]*v1.Pod, error) {
	if h.stateFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(h.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pods []*v1.Pod
	return pods, json.Unmarshal(data, &pods)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// allocate runs kubelet's admission of one pod through the device manager: Allocate for each init container,
// then each container (the order kubelet's topology admit handler uses). On failure the pod is dropped and the
// manager frees whatever it had granted, as kubelet does for a pod it rejects.
func (h *harness) allocate(ctx context.Context, pod *v1.Pod) error {
	h.setPod(pod.UID, pod)
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		if err := h.dm.Allocate(ctx, pod, &containers[i], lifecycle.AddOperation); err != nil {
			h.setPod(pod.UID, nil)
			h.dm.UpdateAllocatedDevices(h.log)
			return fmt.Errorf("container %q: %w", containers[i].Name, err)
		}
	}
	return nil
}

// describe reports, per container, the devices the manager holds for it and the runtime options kubelet
// would hand to the container runtime (the plugin's Allocate responses, merged).
func (h *harness) describe(ctx context.Context, pod *v1.Pod) (map[string]any, error) {
	out := map[string]any{}
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		c := &containers[i]
		opts, err := h.dm.GetDeviceRunContainerOptions(ctx, pod, c)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		devices := map[string][]string{}
		for resource, instances := range h.dm.GetDevices(string(pod.UID), c.Name) {
			ids := make([]string, 0, len(instances))
			for id := range instances {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			devices[resource] = ids
		}
		out[c.Name] = map[string]any{"devices": devices, "runOptions": opts}
	}
	return out, nil
}

// POST /admit, body: a v1.Pod. 200 with the containers' devices; 409 with kubelet's error when it refuses.
func (h *harness) admit(w http.ResponseWriter, r *http.Request) {
	var pod v1.Pod
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&pod); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body is not a pod: " + err.Error()})
		return
	}
	if pod.UID == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "pod has no metadata.uid"})
		return
	}
	h.admitMu.Lock()
	defer h.admitMu.Unlock()
	started := time.Now()
	err := h.allocate(r.Context(), &pod)
	elapsed := time.Since(started)
	if err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	if err := h.saveState(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	containers, err := h.describe(r.Context(), &pod)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	// allocateSeconds: the device manager's own time for the pod (GetPreferredAllocation and Allocate calls
	// to the plugin included), without this API's HTTP and JSON.
	writeJSON(w, http.StatusOK, map[string]any{"uid": pod.UID, "containers": containers, "allocateSeconds": elapsed.Seconds()})
}

// GET /pod?uid=...: what the manager holds for an admitted pod.
func (h *harness) pod(w http.ResponseWriter, r *http.Request) {
	uid := types.UID(r.URL.Query().Get("uid"))
	h.podsMu.RLock()
	pod, ok := h.pods[uid]
	h.podsMu.RUnlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no active pod with uid " + string(uid)})
		return
	}
	containers, err := h.describe(r.Context(), pod)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"uid": uid, "containers": containers})
}

// POST /remove?uid=...: the pod is gone; the manager frees its devices.
func (h *harness) remove(w http.ResponseWriter, r *http.Request) {
	h.admitMu.Lock()
	defer h.admitMu.Unlock()
	h.setPod(types.UID(r.URL.Query().Get("uid")), nil)
	h.dm.UpdateAllocatedDevices(h.log)
	if err := h.saveState(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *harness) capacity(w http.ResponseWriter, _ *http.Request) {
	capacity, allocatable, inactive := h.dm.GetCapacity(h.log)
	writeJSON(w, http.StatusOK, map[string]any{"capacity": capacity, "allocatable": allocatable, "inactive": inactive})
}

// GET /devices: every device the manager knows, by resource, with its health.
func (h *harness) devices(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.dm.GetAllocatableDevices(h.log))
}

func run() error {
	klog.InitFlags(nil)
	socketDir := flag.String("socket-dir", "/var/lib/kubelet/device-plugins",
		"kubelet's device-plugin directory: kubelet.sock, the plugins' sockets and the checkpoint")
	listen := flag.String("listen", "127.0.0.1:0", "loopback address of the test API")
	stateFile := flag.String("state-file", "", "where the active pods are kept across restarts (none: not kept)")
	podResourcesSocket := flag.String("pod-resources-socket", "", "serve kubelet's PodResources v1 API here (none: off)")
	flag.Parse()
	log := klog.Background()

	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("--listen %q: must be a loopback address", *listen)
	}
	if err := os.MkdirAll(*socketDir, 0o750); err != nil {
		return err
	}
	dm, err := newManagerImpl(log, filepath.Join(*socketDir, "kubelet.sock"), nil, topologymanager.NewFakeManager(log))
	if err != nil {
		return fmt.Errorf("creating the device manager: %w", err)
	}
	h := &harness{pods: map[types.UID]*v1.Pod{}, dm: dm, log: log, stateFile: *stateFile}

	// After a restart kubelet knows its pods and their running containers before the device manager starts.
	restored, err := h.loadState()
	if err != nil {
		return fmt.Errorf("reading %s: %w", *stateFile, err)
	}
	containers, running := containermap.NewContainerMap(), sets.New[string]()
	for _, pod := range restored {
		h.setPod(pod.UID, pod)
		for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
			id := fmt.Sprintf("restored-%s-%s", pod.UID, c.Name)
			containers.Add(string(pod.UID), c.Name, id)
			running.Insert(id)
		}
	}
	if err := dm.Start(log, h.activePods, allReady{}, containers, running); err != nil {
		return fmt.Errorf("starting the device manager: %w", err)
	}
	defer func() { _ = dm.Stop(log) }()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /capacity", h.capacity)
	mux.HandleFunc("GET /devices", h.devices)
	mux.HandleFunc("GET /pod", h.pod)
	mux.HandleFunc("POST /admit", h.admit)
	mux.HandleFunc("POST /remove", h.remove)
	// Go's profiler, for the allocation benchmark: where the manager's time goes.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *podResourcesSocket != "" {
		if err := servePodResources(ctx, h, *podResourcesSocket); err != nil {
			return fmt.Errorf("serving PodResources on %s: %w", *podResourcesSocket, err)
		}
	}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	// One line on stdout that the tests wait for: where the API listens.
	fmt.Printf("dmharness listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dmharness:", err)
		os.Exit(1)
	}
}
