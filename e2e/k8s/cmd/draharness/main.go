// Command draharness runs kubelet's real DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra) outside a
// kubelet, so gpuslice's tests can drive it: DRA drivers register through kubelet's real plugin manager, which
// watches the plugins_registry directory for registration sockets exactly as kubelet does, and the manager
// calls them over real gRPC. It reads ResourceClaims from the real API server through a kubeconfig. A small
// loopback HTTP API prepares a pod's claims (what kubelet does before it starts the pod's containers) and
// unprepares them (after the pod has terminated).
//
// Everything used is exported in k8s.io/kubernetes v1.37.2 (pinned in go.mod), so no go:linkname is needed:
// dra.NewManager and the Manager's Start, PrepareResources, UnprepareResources, GetResources,
// GetContainerClaimInfos and GetWatcherHandler, and pluginmanager.NewPluginManager. The harness differs from
// kubelet in what feeds the manager: the active pods are the ones prepared through the API and not yet
// unprepared, kept in a file across restarts (kubelet's pod manager), and the credentials are the kubeconfig's (kubelet's node identity).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// allReady is kubelet's SourcesReady once every pod source has been seen: the manager's reconcile loop may then
// unprepare the claims of pods that are no longer active.
type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type harness struct {
	opMu      sync.Mutex // kubelet's pod workers prepare and unprepare one pod at a time per pod; one at a time here
	podsMu    sync.RWMutex
	pods      map[types.UID]*v1.Pod // prepared pods: the manager's reconcile loop unprepares claims of any other pod
	dm        *dra.Manager
	stateFile string
}

// saveState writes the prepared pods atomically: a restarted harness knows them before its manager starts, as
// kubelet knows its pods from the API server after a restart (else the reconcile loop would unprepare them).
func (h *harness) saveState() error {
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

func (h *harness) loadState() error {
	data, err := os.ReadFile(h.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var pods []*v1.Pod
	if err := json.Unmarshal(data, &pods); err != nil {
		return fmt.Errorf("%s: %w", h.stateFile, err)
	}
	for _, pod := range pods {
		h.setPod(pod, true)
	}
	return nil
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

func (h *harness) setPod(pod *v1.Pod, active bool) {
	h.podsMu.Lock()
	defer h.podsMu.Unlock()
	if active {
		h.pods[pod.UID] = pod
	} else {
		delete(h.pods, pod.UID)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func readPod(w http.ResponseWriter, r *http.Request) (*v1.Pod, bool) {
	var pod v1.Pod
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&pod); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body is not a pod: " + err.Error()})
		return nil, false
	}
	if pod.UID == "" || pod.Namespace == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "pod needs metadata.uid and metadata.namespace"})
		return nil, false
	}
	return &pod, true
}

type device struct {
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	ShareID      string   `json:"shareID,omitempty"`
	Requests     []string `json:"requests"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// describe reports what the manager holds for a prepared pod: per container, the CDI device IDs kubelet would
// hand to the container runtime; per claim, the devices the drivers prepared.
func (h *harness) describe(pod *v1.Pod) (map[string]any, error) {
	containers := map[string][]string{}
	claims := map[string][]device{}
	for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		info, err := h.dm.GetResources(pod, &c)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		ids := []string{}
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		containers[c.Name] = ids
		infos, err := h.dm.GetContainerClaimInfos(pod, &c)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		for _, ci := range infos {
			if _, seen := claims[ci.ClaimName]; seen {
				continue
			}
			devices := []device{}
			for driver, st := range ci.DriverState {
				for _, d := range st.Devices {
					out := device{Driver: driver, Pool: d.PoolName, Device: d.DeviceName,
						Requests: d.RequestNames, CDIDeviceIDs: d.CDIDeviceIDs}
					if d.ShareID != nil {
						out.ShareID = string(*d.ShareID)
					}
					devices = append(devices, out)
				}
			}
			sort.Slice(devices, func(i, j int) bool { return devices[i].Device < devices[j].Device })
			claims[ci.ClaimName] = devices
		}
	}
	return map[string]any{"containers": containers, "claims": claims}, nil
}

// POST /prepare, body: a v1.Pod as bound by the scheduler. The manager reads the pod's claims from the API server
// and calls NodePrepareResources of their drivers. 200 with the CDI devices; 409 with the manager's error.
func (h *harness) prepare(w http.ResponseWriter, r *http.Request) {
	pod, ok := readPod(w, r)
	if !ok {
		return
	}
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.setPod(pod, true)
	started := time.Now()
	if err := h.dm.PrepareResources(r.Context(), pod); err != nil {
		// kubelet would retry; the pod is not running, so the reconcile loop may clean up what was prepared.
		h.setPod(pod, false)
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	elapsed := time.Since(started)
	if err := h.saveState(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	out, err := h.describe(pod)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	out["uid"] = pod.UID
	out["prepareSeconds"] = elapsed.Seconds()
	writeJSON(w, http.StatusOK, out)
}

// POST /unprepare, body: the pod, now terminated. The manager calls NodeUnprepareResources for the claims no
// other prepared pod uses. 204, or 409 with the manager's error (the pod stays prepared, as in kubelet).
func (h *harness) unprepare(w http.ResponseWriter, r *http.Request) {
	pod, ok := readPod(w, r)
	if !ok {
		return
	}
	h.opMu.Lock()
	defer h.opMu.Unlock()
	if err := h.dm.UnprepareResources(r.Context(), pod); err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	h.setPod(pod, false)
	if err := h.saveState(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GET /driver?name=...: 200 when the manager knows a plugin of the driver (it may be disconnected: GetPlugin then
// returns the newest one).
func (h *harness) driver(w http.ResponseWriter, r *http.Request) {
	plugins, ok := h.dm.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "unexpected watcher handler type"})
		return
	}
	if _, err := plugins.GetPlugin(r.URL.Query().Get("name")); err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"driver": r.URL.Query().Get("name")})
}

// startupWipe reports when the DRA plugin manager's startup wipe of this node's ResourceSlices has been answered
// by the API server: kubelet deletes them all at startup, and a slice published before that would be lost.
type startupWipe struct {
	once sync.Once
	done chan struct{}
}

// wrap is a rest.Config transport wrapper that watches for the wipe: a DELETE of the resourceslices collection.
func (s *startupWipe) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && req.Method == http.MethodDelete && strings.HasSuffix(req.URL.Path, "/resourceslices") &&
			resp.StatusCode < 300 {
			s.once.Do(func() { close(s.done) })
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func run() error {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (kubelet would use the node's credentials)")
	nodeName := flag.String("node-name", "", "the node this harness is the kubelet of (must exist)")
	registryDir := flag.String("plugins-registry-dir", "/var/lib/kubelet/plugins_registry",
		"where DRA drivers put their registration sockets (kubelet's plugins_registry)")
	stateDir := flag.String("state-dir", "", "the DRA manager's checkpoint directory, and the prepared pods")
	listen := flag.String("listen", "127.0.0.1:0", "loopback address of the test API")
	wipeTimeout := flag.Duration("startup-wipe-timeout", 30*time.Second,
		"how long to wait for kubelet's startup wipe of the node's ResourceSlices")
	flag.Parse()
	log := klog.Background()

	if *kubeconfig == "" || *nodeName == "" || *stateDir == "" {
		return errors.New("--kubeconfig, --node-name and --state-dir are required")
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("--listen %q: must be a loopback address", *listen)
	}
	for _, dir := range []string{*registryDir, *stateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", *kubeconfig, err)
	}
	wipe := &startupWipe{done: make(chan struct{})}
	restConfig.Wrap(wipe.wrap)
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, log)

	dm, err := dra.NewManager(log, client, *stateDir)
	if err != nil {
		return fmt.Errorf("creating the DRA manager: %w", err)
	}
	h := &harness{pods: map[types.UID]*v1.Pod{}, dm: dm, stateFile: filepath.Join(*stateDir, "harness-pods.json")}
	if err := h.loadState(); err != nil {
		return fmt.Errorf("reading the prepared pods: %w", err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *nodeName, metav1.GetOptions{})
	}
	if err := dm.Start(ctx, h.activePods, getNode, allReady{}); err != nil {
		return fmt.Errorf("starting the DRA manager: %w", err)
	}
	defer dm.Stop()

	// kubelet's plugin manager: watches the registry directory, calls GetInfo on each registration socket, hands
	// DRAPlugin registrations to the DRA manager's handler and reports back with NotifyRegistrationStatus.
	plugins := pluginmanager.NewPluginManager(*registryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, dm.GetWatcherHandler())
	go plugins.Run(ctx, allReady{}, ctx.Done())

	select {
	case <-wipe.done:
	case <-time.After(*wipeTimeout):
		return fmt.Errorf("kubelet's startup wipe of node %s's ResourceSlices did not finish in %s", *nodeName, *wipeTimeout)
	case <-ctx.Done():
		return nil
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /driver", h.driver)
	mux.HandleFunc("POST /prepare", h.prepare)
	mux.HandleFunc("POST /unprepare", h.unprepare)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	// One line on stdout that the tests wait for: where the API listens.
	fmt.Printf("draharness listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "draharness:", err)
		os.Exit(1)
	}
}
