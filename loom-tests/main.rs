#![cfg(taskstage_loom)]
