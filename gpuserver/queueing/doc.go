// Package queueing orders pending requests (or asynchronous messages) of many functions so that as many functions
// as possible meet their latency SLOs. It has no I/O and no clock of its own: every call that needs the time takes
// now. A Queue is not safe for concurrent use; its owner serialises calls (the controller holds its lock, the
// queue worker its own).
//
// One Queue serves both the gpuserver's acquire path (through gpuserver/controller) and the queue worker's
// ordering of asynchronous messages, so there is one implementation of the ordering.
//
// # Use
//
//	q, err := queueing.New(queueing.Config{Order: queueing.OrderSLOAware})
//	q.SetFunction("resnet", 80*time.Millisecond, 98)         // SLO and percentile
//	q.Push(queueing.Request{ID: 1, Function: "resnet", Arrival: now, Cost: 30 * time.Millisecond})
//	r, ok := q.Pop(now, func(function string) bool { return true }) // next request whose function is eligible
//	... serve r ...
//	q.Observe("resnet", latency <= 80*time.Millisecond, latency) // feeds the SLO bookkeeping
//
// Request.Cost is the caller's predicted swap plus execution time at push; Request.Deadline defaults to
// Arrival + the function's SLO. Remove takes a request out again (a cancelled acquire).
//
// # Orders
//
//   - OrderFIFO: arrival order.
//   - OrderDQLS (gShare): least slack first, slack = deadline - now - (1+Margin)*Cost; Margin defaults to 0.4.
//   - OrderTorpor (Torpor's prototype, Sec. 5.2): per function n requests served and m of them on time; the
//     required request count RRC = (p*n - m)/(1 - p) for SLO percentile p. Every RegroupEvery (2 s) functions are
//     ranked by expected cost = mean latency x RRC, and the cheapest ones whose positive costs add up to a
//     fraction alpha of the total form the high-priority group (functions at or under their target are always
//     in it); the rest are low priority. alpha starts at 1 and is re-tuned every AlphaWindow regroupings from the
//     trend of the share of functions meeting their SLO against the share at the last change (the first
//     measurement sets it): up 4% or more doubles it (at most 1), down more than 4% halves it, otherwise it grows
//     by 1%. From a share of 0, any rise counts as up and staying at 0 as flat. High-priority functions go first, the most needy (highest
//     mean latency x (p*n - m)) first; low-priority ones cheapest first; FIFO within a function.
//   - OrderSLOAware (faas-gpu's default): Torpor's two groups, and within a group least slack first as in DQLS,
//     except that requests that can no longer meet their deadline (negative slack) go after every request that
//     still can, oldest first; requests without an SLO go last. With RescueShare set, while at least that share of
//     the functions meet their SLO a request is late only once deadline - now - Cost < 0 (the margin then orders
//     requests but does not demote them); on an overloaded node the margined slack demotes again. With SpareLast
//     (faas-gpu), among the requests that can still make it those of functions that can spare a miss (m - p*n >=
//     max(1, n*(1-p)/4)) go after those of functions that cannot, and while the owner says the node is pressed
//     (SetPressed) they go most needy first (Torpor's need), so the function with the most misses to spare is
//     served last. A function that is lost for now (rrc > n, after at least 1/(1-p) requests) goes with those
//     that can spare a miss, and last of them while the node is pressed.
//
// # The SLO record
//
// n counts the requests served (Observe) and those refused or dropped unserved (ObserveMissed: the admission
// rule's refusals, which the faas-gpu policy counts as the function's SLO counts them); m those served on time.
// The instances of one function (pool.InstanceKey) keep one record, their function's (SetFamily): the SLO is the
// function's, over all its instances' requests, and an instance the autoscaler starts begins from it.
//
// # Cost
//
// Requests are kept per function in a heap; Pop scans the functions that have requests waiting (O(functions with
// waiting requests)), Push and Remove are O(log requests of the function). BenchmarkPushPop measures it.
package queueing
