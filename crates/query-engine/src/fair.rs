//! Fair shares of the engine's cores between projects.
//!
//! DataFusion runs a query's operators as tasks on the engine's threads, and keeps them busy for as long as the
//! query has work, so one project's heavy query would hold every core while another project's small one waits
//! for it to finish. Here at most [`FairScheduler::slots`] queries execute at once in the whole process
//! (one per core, at least two), each holding a slot for a time slice at most while another query waits:
//!
//! - A query takes a [`Ticket`] before it executes. With a slot free it runs at once; otherwise it waits in its
//!   project's queue, and projects with waiting queries are served in turn, so a project with one query
//!   waiting is served as soon as a slot's slice ends, however many queries another project has queued.
//! - Every operator of the query's physical plan is wrapped ([`gate`]) so that its output stream asks the
//!   ticket before producing a batch: a query without a slot stops at its next batch, all its tasks together,
//!   and a query whose slice has ended while others wait gives its slot to the next and queues again.
//!
//! - A join does work between two batches of its inputs that no memory bounds: a nested-loop join evaluates its
//!   filter over every pair of rows, and a hash join over every pair of rows of equal keys, emitting only the
//!   pairs that pass, so a filter that passes none keeps the join inside one poll for as long as the pairs
//!   last (a filtered cross join of two million-row series: minutes). So a join's filter asks the ticket too,
//!   before each evaluation ([`GatedFilter`]); one whose slice has ended while others wait gives its slot on and
//!   parks its thread until its turn comes back, the engine's runtime moving that thread's other tasks on
//!   meanwhile.
//!
//! So a small query of another project waits one slice, then shares the cores with the heavy ones. Other work
//! inside one batch (sorting what a sort has buffered, say) is not cut; it is bounded by the query's memory.
//! Planning is not gated either: it is bounded by the size and nesting of the SQL (`compile`).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{
    HashJoinExec, NestedLoopJoinExec, NestedLoopJoinExecBuilder, SortMergeJoinExec,
};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
};
use domain::ProjectId;
use futures_util::Stream;

/// How long a query keeps a slot while another query waits for one.
pub(crate) const SLICE: Duration = Duration::from_millis(10);

/// The slots of the process and the queries waiting for one.
pub(crate) struct FairScheduler {
    slots: usize,
    slice: Duration,
    epoch: Instant,
    /// Tickets waiting, so that a running query checks the queue only when someone is in it.
    waiting: AtomicUsize,
    state: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    running: usize,
    /// Slots each project holds now.
    holding: HashMap<ProjectId, usize>,
    /// Projects with waiting tickets, in the order they are served, each with its tickets in arrival order.
    projects: VecDeque<(ProjectId, VecDeque<Arc<Turn>>)>,
}

impl Queue {
    fn took(&mut self, project: ProjectId) {
        *self.holding.entry(project).or_default() += 1;
    }

    fn gave(&mut self, project: ProjectId) {
        if let Some(held) = self.holding.get_mut(&project) {
            *held -= 1;
            if *held == 0 {
                self.holding.remove(&project);
            }
        }
    }
}

impl fmt::Debug for FairScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairScheduler")
            .field("slots", &self.slots)
            .field("waiting", &self.waiting.load(Ordering::Relaxed))
            .finish()
    }
}

/// One query's claim on a slot.
struct Turn {
    project: ProjectId,
    holding: AtomicBool,
    /// When it was given its slot, in nanoseconds since the scheduler's epoch.
    since: AtomicU64,
    wakers: Mutex<Vec<Waker>>,
}

impl Turn {
    fn wake(&self) {
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(PoisonError::into_inner));
        for waker in wakers {
            waker.wake();
        }
    }

    fn wait(&self, cx: &Context<'_>) {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
    }
}

impl FairScheduler {
    /// A scheduler of `slots` queries at once, each holding its slot for `slice` while others wait.
    pub(crate) fn new(slots: usize, slice: Duration) -> Arc<Self> {
        Arc::new(Self {
            slots: slots.max(1),
            slice,
            epoch: Instant::now(),
            waiting: AtomicUsize::new(0),
            state: Mutex::default(),
        })
    }

    /// One slot per core, and at least two, so that a query waiting on storage does not idle the process.
    pub(crate) fn per_core() -> Arc<Self> {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        Self::new(cores.max(2), SLICE)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A ticket for a query of `project`: holding a slot already when one is free, else queued.
    pub(crate) fn ticket(self: &Arc<Self>, project: ProjectId) -> Ticket {
        let turn = Arc::new(Turn {
            project,
            holding: AtomicBool::new(false),
            since: AtomicU64::new(0),
            wakers: Mutex::default(),
        });
        let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.running < self.slots {
            queue.running += 1;
            self.grant(&mut queue, &turn);
        } else {
            self.enqueue(&mut queue, Arc::clone(&turn));
        }
        Ticket { scheduler: Arc::clone(self), turn }
    }

    fn grant(&self, queue: &mut Queue, turn: &Turn) {
        queue.took(turn.project);
        turn.since.store(self.now(), Ordering::Relaxed);
        turn.holding.store(true, Ordering::Release);
        turn.wake();
    }

    fn enqueue(&self, queue: &mut Queue, turn: Arc<Turn>) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        match queue.projects.iter_mut().find(|(project, _)| *project == turn.project) {
            Some((_, turns)) => turns.push_back(turn),
            None => queue.projects.push_back((turn.project, VecDeque::from([turn]))),
        }
    }

    /// The next waiting ticket: the first of the waiting project that holds the fewest slots (the first in
    /// turn among equals), which then goes to the back of the turn.
    fn next(&self, queue: &mut Queue) -> Option<Arc<Turn>> {
        let held = |project: &ProjectId| queue.holding.get(project).copied().unwrap_or(0);
        let index = (0..queue.projects.len()).min_by_key(|i| held(&queue.projects[*i].0))?;
        let (project, mut turns) = queue.projects.remove(index)?;
        let turn = turns.pop_front();
        if !turns.is_empty() {
            queue.projects.push_back((project, turns));
        }
        if turn.is_some() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        turn
    }

    /// Gives `turn`'s slot to the next waiting ticket and queues `turn` again; false when nobody waits.
    fn rotate(&self, turn: &Arc<Turn>) -> bool {
        let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !turn.holding.load(Ordering::Acquire) {
            return true;
        }
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        queue.gave(turn.project);
        let Some(next) = self.next(&mut queue) else {
            queue.took(turn.project);
            return false;
        };
        turn.holding.store(false, Ordering::Release);
        self.grant(&mut queue, &next);
        self.enqueue(&mut queue, Arc::clone(turn));
        true
    }

    /// A finished (or cancelled) query's slot goes to the next waiting ticket; a waiting one leaves the queue.
    fn release(&self, turn: &Arc<Turn>) {
        let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if turn.holding.swap(false, Ordering::AcqRel) {
            queue.gave(turn.project);
            match self.next(&mut queue) {
                Some(next) => self.grant(&mut queue, &next),
                None => queue.running -= 1,
            }
            return;
        }
        for (_, turns) in &mut queue.projects {
            let before = turns.len();
            turns.retain(|waiting| !Arc::ptr_eq(waiting, turn));
            if turns.len() < before {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
        queue.projects.retain(|(_, turns)| !turns.is_empty());
    }

    /// Queries executing now, and waiting for a slot.
    #[cfg(test)]
    pub(crate) fn load(&self) -> (usize, usize) {
        let queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (queue.running, self.waiting.load(Ordering::Relaxed))
    }
}

/// A query's claim on a slot; dropping it (the query ended or was cancelled) frees the slot or its place.
pub(crate) struct Ticket {
    scheduler: Arc<FairScheduler>,
    turn: Arc<Turn>,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("project", &self.turn.project)
            .field("holding", &self.turn.holding.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.scheduler.release(&self.turn);
    }
}

impl Ticket {
    /// Whether the query may produce its next batch now; if not, the task is woken when it may.
    fn poll_turn(&self, cx: &Context<'_>) -> Poll<()> {
        let (scheduler, turn) = (&self.scheduler, &self.turn);
        if turn.holding.load(Ordering::Acquire) {
            let held = scheduler.now().saturating_sub(turn.since.load(Ordering::Relaxed));
            let slice_over = held > u64::try_from(scheduler.slice.as_nanos()).unwrap_or(u64::MAX);
            if !slice_over || scheduler.waiting.load(Ordering::Relaxed) == 0 || !scheduler.rotate(turn) {
                return Poll::Ready(());
            }
        }
        turn.wait(cx);
        // Granted between the check and the registration: go on rather than wait for a wake already sent.
        if turn.holding.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// A ticket shared by the operators of its query's plan and the query's caller, released with the last of
/// them, with the flag its caller's going away sets (see `runtime::cancellation`).
#[derive(Clone)]
pub(crate) struct Held(Arc<Ticket>, Option<Arc<AtomicBool>>);

impl Held {
    /// `ticket`, for a query whose caller the current engine task serves.
    pub(crate) fn new(ticket: Ticket) -> Self {
        Self(Arc::new(ticket), crate::runtime::cancellation())
    }

    fn ticket(&self) -> &Ticket {
        &self.0
    }

    fn cancelled(&self) -> bool {
        self.1.as_ref().is_some_and(|flag| flag.load(Ordering::Acquire))
    }

    /// Waits, parking the thread, until the query may go on with work that happens inside one poll (a join's
    /// filter over pairs of rows); at once when nobody else waits or its slice goes on. On a runtime without
    /// threads to spare for the thread's other tasks (a current-thread one), it goes on.
    ///
    /// # Errors
    /// The query's caller went away: the work stops here rather than at its next poll, which a join over
    /// pairs may not reach for minutes.
    fn block_for_turn(&self) -> Result<()> {
        let (scheduler, turn) = (&self.0.scheduler, &self.0.turn);
        if self.cancelled() {
            return Err(DataFusionError::Execution("The query was cancelled.".into()));
        }
        if scheduler.waiting.load(Ordering::Relaxed) == 0 && turn.holding.load(Ordering::Acquire) {
            return Ok(());
        }
        let waker = futures_util::task::noop_waker();
        if self.0.poll_turn(&Context::from_waker(&waker)).is_ready() {
            return Ok(());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return Ok(()) };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Ok(());
        }
        // Parked a slice at a time, so that a caller going away meanwhile is seen.
        let granted = std::future::poll_fn(|cx| self.0.poll_turn(cx));
        let waited = tokio::task::block_in_place(|| {
            runtime.block_on(async {
                tokio::pin!(granted);
                loop {
                    if tokio::time::timeout(scheduler.slice, &mut granted).await.is_ok() {
                        return true;
                    }
                    if self.cancelled() {
                        return false;
                    }
                }
            })
        });
        if waited {
            Ok(())
        } else {
            Err(DataFusionError::Execution("The query was cancelled.".into()))
        }
    }

    /// Waits for the query's first slot.
    pub(crate) async fn turn(&self) {
        std::future::poll_fn(|cx| self.0.poll_turn(cx)).await;
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ticket().fmt(f)
    }
}

/// `plan` with each of its operators asking `held` before each batch it produces.
///
/// # Errors
/// An operator that cannot take its children back.
pub(crate) fn gate(plan: Arc<dyn ExecutionPlan>, held: &Held) -> Result<Arc<dyn ExecutionPlan>> {
    let children: Vec<Arc<dyn ExecutionPlan>> =
        plan.children().into_iter().map(|child| gate(Arc::clone(child), held)).collect::<Result<_>>()?;
    // The children's properties are their operators': a gate changes none.
    let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep);
    let plan = if children.is_empty() { plan } else { plan.replace_children(children, keep)? };
    let plan = gate_join_filter(plan, held)?;
    Ok(Arc::new(Gated { inner: plan, held: held.clone() }))
}

/// `plan` with its filter gated ([`GatedFilter`]) when it is a join with a filter over pairs of rows.
fn gate_join_filter(plan: Arc<dyn ExecutionPlan>, held: &Held) -> Result<Arc<dyn ExecutionPlan>> {
    let gated = |filter: &JoinFilter| {
        let expression: Arc<dyn PhysicalExpr> =
            Arc::new(GatedFilter { inner: Arc::clone(filter.expression()), held: held.clone() });
        Some(JoinFilter::new(expression, filter.column_indices().to_vec(), Arc::clone(filter.schema())))
    };
    if let Some(join) = plan.downcast_ref::<NestedLoopJoinExec>() {
        if let Some(filter) = join.filter() {
            return Ok(Arc::new(NestedLoopJoinExecBuilder::from(join).with_filter(gated(filter)).build()?));
        }
    } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        if let Some(filter) = join.filter() {
            return Ok(Arc::new(join.builder().with_filter(gated(filter)).build()?));
        }
    } else if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        if let Some(filter) = join.filter() {
            return Ok(Arc::new(SortMergeJoinExec::try_new(
                Arc::clone(join.left()),
                Arc::clone(join.right()),
                join.on().to_vec(),
                gated(filter),
                join.join_type(),
                join.sort_options().to_vec(),
                join.null_equality(),
            )?));
        }
    }
    Ok(plan)
}

/// A join's filter that waits for its query's turn before each evaluation: the join's work between two of its
/// input's batches is cut at the slice's end like any operator's ([`Held::block_for_turn`]), and stops there once its caller went away.
#[derive(Debug)]
struct GatedFilter {
    inner: Arc<dyn PhysicalExpr>,
    held: Held,
}

impl PartialEq for GatedFilter {
    fn eq(&self, other: &Self) -> bool {
        self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for GatedFilter {}

impl std::hash::Hash for GatedFilter {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

impl fmt::Display for GatedFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for GatedFilter {
    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.inner.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.inner.nullable(input_schema)
    }

    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        self.held.block_for_turn()?;
        self.inner.evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let inner = children.into_iter().next().unwrap_or_else(|| Arc::clone(&self.inner));
        Ok(Arc::new(Self { inner, held: self.held.clone() }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}

/// An operator whose output waits for its query's turn.
#[derive(Debug)]
struct Gated {
    inner: Arc<dyn ExecutionPlan>,
    held: Held,
}

impl DisplayAs for Gated {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gated: ")?;
        self.inner.fmt_as(t, f)
    }
}

impl ExecutionPlan for Gated {
    fn name(&self) -> &'static str {
        "Gated"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.inner.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.inner]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let inner = children.into_iter().next().unwrap_or_else(|| Arc::clone(&self.inner));
        Ok(Arc::new(Self { inner, held: self.held.clone() }))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let inner = self.inner.execute(partition, context)?;
        Ok(Box::pin(GatedStream { inner, held: self.held.clone() }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        None
    }
}

struct GatedStream {
    inner: SendableRecordBatchStream,
    held: Held,
}

impl Stream for GatedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.held.ticket().poll_turn(cx).is_pending() {
            return Poll::Pending;
        }
        self.inner.as_mut().poll_next(cx)
    }
}

impl RecordBatchStream for GatedStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(id: i64) -> ProjectId {
        ProjectId::new(id).unwrap()
    }

    fn holding(ticket: &Ticket) -> bool {
        ticket.turn.holding.load(Ordering::Acquire)
    }

    #[tokio::test]
    async fn a_waiting_project_is_served_at_the_next_slice_before_a_busy_ones_queue() {
        let scheduler = FairScheduler::new(2, Duration::from_millis(5));
        let busy: Vec<Ticket> = (0..5).map(|_| scheduler.ticket(project(1))).collect();
        assert_eq!(busy.iter().filter(|t| holding(t)).count(), 2, "two slots");
        let other = scheduler.ticket(project(2));
        assert!(!holding(&other));
        assert_eq!(scheduler.load(), (2, 4));
        // The busy project's running queries see their slice end: the first to ask gives its slot to the other
        // project, which is ahead of the busy project's own three waiting queries.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waker = futures_util::task::noop_waker();
        let cx = Context::from_waker(&waker);
        assert!(busy[0].poll_turn(&cx).is_pending(), "its slice is over and others wait");
        assert!(holding(&other), "the other project runs next");
        // Cancelled queries leave the queue; finished ones give their slot on.
        let mut busy = busy;
        drop(busy.split_off(2));
        assert_eq!(scheduler.load(), (2, 1), "only the rotated query waits");
        drop(busy.pop());
        assert_eq!(scheduler.load(), (2, 0), "the slot it freed went to the rotated one");
    }

    #[tokio::test]
    async fn a_released_slot_goes_to_the_next_waiting_query_and_wakes_it() {
        let scheduler = FairScheduler::new(1, Duration::from_millis(5));
        let first = Held::new(scheduler.ticket(project(1)));
        let second = Held::new(scheduler.ticket(project(2)));
        let waiting = tokio::spawn({
            let second = second.clone();
            async move { second.turn().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert!(holding(second.ticket()));
        drop(second);
        assert_eq!(scheduler.load(), (0, 0));
    }
}
