// The thread that commits meshes for the background mesher. The mesher runs at a low priority
// (mesh_thread_nice, 19 by default) so that its searches and copies use CPU the program leaves
// idle; but while it commits a batch, guarded operations of every thread (remote frees,
// realloc, applied recycled frees) wait for it, and a nice-19 thread preempted there by the
// program's own threads kept them waiting for milliseconds (a 3.2 ms pause in the Redis LRU
// benchmark, of which 280 ns went to waiting for operations in flight). An unprivileged thread
// cannot raise its own priority back for the pause, so the commit runs on this helper instead:
// created by a program thread, it keeps the program's priority, and sleeps on a futex between
// commits (a few microseconds of work each).
#pragma once

namespace meshalloc::CommitThread {

// Starts the helper. Call it from a program thread (the helper inherits its nice value), before
// the background mesher lowers its own. False if the thread could not be created.
bool start();
// Runs job(arg) on the helper and waits for it to finish; runs it on the calling thread when the
// helper is not running (not started, failed, or lost to fork). One caller at a time (the
// mesher's batch lock).
void run(void (*job)(void*), void* arg);
// In a child after fork: the helper did not survive; jobs run inline until start() again.
void forgetAfterFork();

}  // namespace meshalloc::CommitThread
