// Package queue names the JetStream streams, subjects and headers of faas-gpu's asynchronous invocations, and
// creates the streams. It is shared by the front door (which publishes) and the worker (which consumes).
//
// A queue named q lives on stream "OF_<q>" with subject "<q>"; the default queue is "faas-request", so the default
// stream is "OF_faas-request" with subject "faas-request" (the OpenFaaS convention). A function picks another queue
// with the annotation com.openfaas.queue. Messages the worker cannot or will not deliver go to the dead-letter
// stream "OF_faas-dead-letter" (subjects "faas-dead-letter.<q>") with the reason in a header.
//
// Consumers: one durable pull consumer per queue stream, shared by every worker process (the shared-consumer
// mode). There is no consumer per function or per priority class: a work-queue stream admits one consumer per
// subject and every call of a queue travels on the queue's one subject (the OpenFaaS convention), so per-function
// consumers would need per-function subjects; and the worker already orders and admits per function inside its
// window (SLO-aware order, pool capacity), which is what a per-class consumer would buy. Isolation between groups of
// functions is what named queues are for: each has its own stream, consumer, window share and a guaranteed slot.
package queue
