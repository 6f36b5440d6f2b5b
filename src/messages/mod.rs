//! One message enum per actor. Queries end in an `RpcReplyPort` and are made
//! with a timeout; everything else is a cast.

pub mod lease;
pub mod master;
pub mod memory_guard;
pub mod plan;
pub mod pruner;
pub mod refresher;
pub mod supervisor;
pub mod worker;
pub mod writer;

pub use lease::LeaseMsg;
pub use master::MasterMsg;
pub use memory_guard::MemoryGuardMsg;
pub use plan::PlanMsg;
pub use pruner::PrunerMsg;
pub use refresher::RefresherMsg;
pub use supervisor::SupervisorMsg;
pub use worker::WorkerMsg;
pub use writer::WriterMsg;
