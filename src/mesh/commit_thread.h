// The thread that runs the background mesher's batches. The mesher runs at a low priority
// (mesh_thread_nice, 19 by default) so that its searches use CPU the program leaves idle; but
// while a batch runs, a write into one of its spans waits for it, and while it commits, guarded
// operations of every thread (remote frees, realloc, applied recycled frees) wait too. A nice-19
// thread preempted there by the program's own threads kept them waiting for milliseconds (a
// 3.2 ms pause in the Redis LRU benchmark) and, on a busy machine, a write for hundreds of them.
// An unprivileged thread cannot raise its own priority back, so batches run on this helper
// instead: created by a program thread, it keeps the program's priority, and sleeps on a futex
// between batches. Their CPU still counts against meshing's budget.
#pragma once

namespace meshalloc::CommitThread {

// Starts the helper. Call it from a program thread (the helper inherits its nice value), before
// the background mesher lowers its own. False if the thread could not be created.
bool start();
// Runs job(arg) on the helper and waits for it to finish; runs it on the calling thread when the
// helper is not running (not started, failed, or lost to fork). True if the helper ran it. One
// caller at a time (the mesher's batch lock).
bool run(void (*job)(void*), void* arg);
// In a child after fork: the helper did not survive; jobs run inline until start() again.
void forgetAfterFork();

}  // namespace meshalloc::CommitThread
