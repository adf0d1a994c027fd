// Durable slots: runs one cascade task with a write-ahead log (cascade_wal.h). A new log gets
// every checkpoint the program reports, fsynced as each stage ends, then the final result; a
// log of an interrupted run is replayed into a resume request, so the run continues after its
// last completed stage and ends with the slots an uninterrupted run with the same seed ends
// with; a log of a finished run is answered from the log without running anything.
#pragma once

#include <functional>
#include <string>

#include "host/cascade/cascade_run.h"

namespace blue {

struct DurableRun {
    CascadeResult result;            // slot_text filled in
    bool from_log = false;           // the log held a finished run: nothing ran
    size_t resumed_checkpoints = 0;  // checkpoints replayed from the log (0: started afresh)
};

// `notice` receives one line per event a user should see (a torn record dropped, a resume, a
// finished run read back). Fails, naming the file, the byte offset and the fault, on a log that
// belongs to another module, task, seed or engine or that is corrupt; and on a failed run or
// write.
Result<DurableRun> runDurable(CascadeRunner& runner, const CascadeTask& task, bool reference, const std::string& wal_path,
                              const std::function<void(const std::string&)>& notice);

}  // namespace blue
