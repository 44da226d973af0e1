//! pi2-planner: hardware and model profiling, the per-token cost model and the exact solver that
//! turns a memory limit into an execution plan.
//!
//! Empty until the planner work: the dense engine takes its thread count from the command line.
