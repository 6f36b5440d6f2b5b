//! One message enum per actor. Queries end in an `RpcReplyPort` and are made
//! with a timeout; everything else is a cast.

pub mod plan;
pub mod refresher;
pub mod supervisor;
pub mod writer;

pub use plan::PlanMsg;
pub use refresher::RefresherMsg;
pub use supervisor::SupervisorMsg;
pub use writer::WriterMsg;
