package router

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

type resident map[[2]any]bool

func (r resident) Resident(node int, function string) bool { return r[[2]any{node, function}] }

// TestRoute: three 4-GPU nodes. Images are placed on the node with the fewest image bytes: a on 0, b on 1, c on
// 2. A request goes to the node holding the model on a GPU, else its image, else the least loaded - among nodes
// whose load is within the slack (1 request per GPU) of the least loaded; a node answering 429 is skipped until
// its Retry-After; a drained node takes nothing and is removed once idle.
func TestRoute(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.AddNode(t0, "n", 4, 0)
	}
	for i, f := range []string{"a", "b", "c"} {
		if n := r.Register(t0, f, 100); n != i {
			t.Fatalf("image of %s placed on %d, want %d", f, n, i)
		}
	}
	res := resident{{2, "a"}: true}
	pick := func(f string) Pick {
		t.Helper()
		p, err := r.Route(t0, f, res)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := pick("a"); p.Node != 2 || !p.Resident || p.LoadImage {
		t.Fatalf("a: %+v, want node 2 (model on a GPU there)", p)
	}
	if p := pick("b"); p.Node != 1 || p.Resident || p.LoadImage {
		t.Fatalf("b: %+v, want node 1 (its image)", p)
	}
	// Node 2 now carries 1 request (0.25 per GPU), node 1 one, node 0 none: a's model node is within slack.
	for range 4 {
		pick("a")
	}
	// Node 2: 5 requests (1.25 per GPU) > 0 + 1: over the slack, so a goes to its image on node 0.
	if p := pick("a"); p.Node != 0 || p.Resident {
		t.Fatalf("a over slack: %+v, want node 0", p)
	}
	if err := r.Shed(0, "c", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := r.Nodes()[0].Outstanding; got != 0 {
		t.Fatalf("node 0 outstanding after the 429 = %d, want 0", got)
	}
	// c's image is on 2, which now carries 8 requests (2 per GPU, over the slack of node 1's 0.25); node 0
	// sheds c: node 1, loading the image there.
	r.nodes[2].Outstanding = 8
	if p := pick("c"); p.Node != 1 || !p.LoadImage {
		t.Fatalf("c: %+v, want node 1 with an image load", p)
	}
	// Images placed: a, b, c at registration, a noted on node 2 (its GPU copy came from there), c replicated.
	if !r.Nodes()[1].HasImage("c") || r.Counters().Placed != 5 {
		t.Errorf("replication not recorded: %+v", r.Counters())
	}
	if err := r.Drain(2); err != nil {
		t.Fatal(err)
	}
	if p := pick("a"); p.Node == 2 {
		t.Fatal("routed to a draining node")
	}
	for range 8 {
		_ = r.Finished(2)
	}
	if r.Nodes()[2].State != Removed || r.Serving() != 2 {
		t.Fatalf("drained node %v, serving %d", r.Nodes()[2].State, r.Serving())
	}
	if _, err := r.Route(t0, "zzz", res); !errors.Is(err, ErrUnknownFunction) {
		t.Errorf("unknown function: %v", err)
	}
	for _, n := range []int{0, 1} {
		_ = r.Shed(n, "b", t0.Add(time.Second))
	}
	if _, err := r.Route(t0, "b", res); !errors.Is(err, ErrNoNode) {
		t.Errorf("every node sheds b: %v", err)
	}
	if p, err := r.Route(t0.Add(time.Second), "b", res); err != nil || p.Node != 1 {
		t.Errorf("after Retry-After: %+v %v, want node 1 (its image)", p, err)
	}
}

// TestImagesLRU: a node with room for two 100-byte images keeps the two used last.
func TestImagesLRU(t *testing.T) {
	r, _ := New(Config{})
	r.AddNode(t0, "n", 1, 200)
	for i, f := range []string{"a", "b", "c"} {
		r.Register(t0.Add(time.Duration(i)*time.Second), f, 100)
	}
	n := r.Nodes()[0]
	if n.HasImage("a") || !n.HasImage("b") || !n.HasImage("c") || r.Counters().ImageDropped != 1 {
		t.Fatalf("images a %v b %v c %v, dropped %d", n.HasImage("a"), n.HasImage("b"), n.HasImage("c"),
			r.Counters().ImageDropped)
	}
	if p, _ := r.Route(t0.Add(5*time.Second), "a", nil); !p.LoadImage || n.HasImage("b") {
		t.Fatalf("a reloaded %+v; b (least recently used) dropped: %v", p, !n.HasImage("b"))
	}
}

// TestAutoscaler: 30 s intervals on 4-GPU nodes. Attainment below 99% adds a node (not while one is starting);
// utilisation under 45% of one node fewer drains one after the cooldown; a refused request holds a drain back.
func TestAutoscaler(t *testing.T) {
	a, err := NewAutoscaler(AutoscaleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	step := func(serving, pending int, onTime, late int, held time.Duration) Action {
		for range onTime {
			a.Observe(true, held)
		}
		for range late {
			a.Observe(false, held)
		}
		now = now.Add(30 * time.Second)
		return a.Decide(now, serving, pending, 4)
	}
	if got := a.Decide(now, 1, 0, 4); got != Hold {
		t.Fatalf("first decision %v", got)
	}
	if got := step(1, 0, 95, 5, time.Millisecond); got != AddNode {
		t.Fatalf("95%% on time: %v, want add", got)
	}
	if got := step(1, 1, 95, 5, time.Millisecond); got != Hold {
		t.Fatalf("while a node starts: %v, want hold", got)
	}
	// 2 nodes, 8 GPUs, 240 GPU-s in 30 s; 100 requests of 1 s: 100/240 = 42% of two nodes, 83% of one: hold.
	if got := step(2, 0, 100, 0, time.Second); got != Hold {
		t.Fatalf("83%% of one node: %v", got)
	}
	// 3 nodes, 40 requests of 1 s: 40/360 x 3/2 = 17% of two nodes; once the cooldown (2 min since the add) has
	// passed, the third node is drained.
	if got := step(3, 0, 40, 0, time.Second); got != Hold {
		t.Fatalf("idle third node within the cooldown: %v, want hold", got)
	}
	now = now.Add(time.Minute)
	if got := step(3, 0, 40, 0, time.Second); got != DrainNode {
		t.Fatalf("idle third node: %v, want drain", got)
	}
	a.Refused()
	now = now.Add(3 * time.Minute)
	if got := step(3, 0, 40, 0, time.Second); got != AddNode {
		t.Fatalf("a refused request (1 of 41 missed): %v, want add", got)
	}
	if _, err := NewAutoscaler(AutoscaleConfig{UpUtil: 0.3, DownUtil: 0.5}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("down above up accepted: %v", err)
	}
}

// TestRoundRobin: the round-robin router takes nodes in turn whatever they hold, skipping one that sheds.
func TestRoundRobin(t *testing.T) {
	r, err := New(Config{RoundRobin: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r.AddNode(t0, fmt.Sprintf("n%d", i), 4, 0)
	}
	r.Register(t0, "f", 1e9)
	res := residentOn{0: true}
	var got []int
	for range 4 {
		p, err := r.Route(t0, "f", res)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Node)
	}
	if fmt.Sprint(got) != "[0 1 2 0]" {
		t.Fatalf("round robin visited %v", got)
	}
	_ = r.Shed(1, "f", t0.Add(time.Second))
	if p, _ := r.Route(t0, "f", res); p.Node != 2 {
		t.Fatalf("after 0 came %d, want 2 (1 sheds f)", p.Node)
	}
}

type residentOn map[int]bool

func (m residentOn) Resident(node int, _ string) bool { return m[node] }
