"""Checkpoints: atomic saves and resume selection, resume compatibility, and merge to Hugging Face.

    manager.CheckpointManager   save / clean_leftovers / latest_valid / retention (light: stdlib only)
    manifest                    MANIFEST.json: build (hash + fsync) and verify
    compat                      run_fingerprint at save time, check_resume at resume time
    trained                     the policy rebuilt in one process from a checkpoint (torch, DCP)
    merge                       merge_run / export_hf / push_to_hub: a verified HF folder
    run_lock                    RunLock: one writer per run folder (flock on the folder)
"""
