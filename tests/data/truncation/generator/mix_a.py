from dsl import C, T, TOOL

CONVOS = []

# m1 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-pytest-session-fixture",
        lang="mixed",
        schema="openai.chat",
        system="你是一个资深 Python 工程师助手，回答简洁，可以中英混用。",
        turns=[
            T(
                "帮我写个 commit message，改动是修复 login 页面在 Safari 上 button 点不动的 bug。",
                "可以这样写：'fix(login): make submit button clickable on Safari'，body 里补一句原因，比如 'Safari 下 button 被一个透明的 overlay div 盖住了，给 overlay 加 pointer-events: none'，再附上 issue 号 'Closes #482'。title 控制在 50 个字符左右，用祈使句，body 解释 why 而不是 what，reviewer 和以后 git blame 的人都会感谢你。",
            ),
            T(
                "周末想去露营，帐篷选 two-person 还是 three-person 的？我们就两个人。",
                "两个人建议买 three-person 的。厂商标的人数是按肩并肩躺满算的，两人帐里基本没地方放背包和鞋，下雨天会很憋屈。三人帐多出来的空间可以放装备，重量一般只多几百克。如果你们是开车露营，不在乎重量，甚至可以考虑四人帐，舒适度完全不一样。",
            ),
            T(
                "最近 on-call 太累了，每周都被半夜叫起来，跟 manager 怎么提调整 rotation？",
                "带数据去谈会更有说服力：把最近一两个月的 page 次数、半夜被叫醒的次数、每次处理时长整理成一张表。然后提具体方案，比如 rotation 从 4 人扩到 6 人、加一个 secondary、或者把几个 noisy 的 alert 降级成白天处理的 ticket。重点放在 'alert fatigue 会导致真正的 incident 被漏掉'，而不是单纯说累。",
            ),
            T(
                "TypeScript 里 interface 和 type 有什么区别？什么时候用哪个？",
                "大部分场景两者可以互换。区别主要是：interface 可以 declaration merging，同名会自动合并，适合给第三方库扩展类型；可以 extends。type 更灵活，能写 union、intersection、mapped type、conditional type，比如 type Status = 'ok' | 'error'。一个常见约定是：描述 object 的形状用 interface，需要组合或者 union 的时候用 type，团队统一就好。",
            ),
            T(
                "我们的 pytest 跑得很慢，每个 test 都重新建一次 Postgres 连接和 schema，fixture 怎么改能快点？",
                "把建库建表的 fixture 改成 scope='session'，整个 test session 只建一次 engine 和 schema；每个 test 再用一个 function scope 的 fixture 开一个 transaction（或者 SAVEPOINT），yield connection，test 结束直接 rollback，这样数据互相隔离又不用重建表。注意 session fixture 里别放可变的全局数据。如果以后用 pytest-xdist 并行，每个 worker 会各自跑一次 session fixture，要用 worker_id 区分数据库名，比如 test_db_gw0、test_db_gw1。",
            ),
            T(
                "中午想点个 healthy 一点的外卖，有什么推荐？",
                "可以点 poke bowl 或者轻食沙拉，选糙米或者藜麦做底，蛋白质选三文鱼、鸡胸或者豆腐，酱汁要分开放，自己控制用量。中餐的话，清蒸鱼、白灼菜心加半碗米饭也不错。尽量避开油炸、勾芡和重口味的菜。外卖的汤和饮料往往热量不低，换成无糖茶或者白水。",
            ),
            T(
                "怎么用 jq 从一个 JSON array 里把所有 name 字段拿出来？",
                "如果顶层就是 array：jq '.[].name' data.json，会每行输出一个带引号的字符串；加 -r 输出 raw string：jq -r '.[].name'。想要结果还是一个 array 就用 jq '[.[].name]' 或 jq 'map(.name)'。如果 array 在某个字段下，比如 .items，就写 jq -r '.items[].name'。有的元素可能没有 name，可以用 '.[] | select(.name != null) | .name' 过滤掉。",
            ),
            T(
                "我想学 Rust，有什么入门资源？",
                "首选官方的 'The Rust Programming Language'，也就是大家说的 the book，免费而且写得很清楚。配合 Rustlings 做小练习，专门帮你适应 borrow checker。想看例子可以翻 'Rust by Example'。学到一半建议马上写个小项目，比如一个 CLI 工具或者简单的 HTTP server，ownership 和 lifetime 只有在真实代码里踩过坑才会真正理解。",
            ),
            T(
                "家里 NAS 放照片和文档，两块盘用 RAID 1 还是别的？",
                "两块盘的话就是 RAID 1，一块盘坏了数据还在，换盘重建就行。不过要记住 RAID 不是 backup：误删、勒索病毒、NAS 本身坏掉，RAID 1 都救不了。重要的照片还是要按 3-2-1 原则，另外再备份到一块外置硬盘或者云存储，比如 Backblaze B2，定期检查备份能不能恢复。",
            ),
            T(
                "老板让我写个 tech design doc，结构怎么组织？",
                "常见结构是：Background 和 Problem，说明为什么要做；Goals 和 Non-goals，划清边界；Proposed Design，包括架构图、数据模型、API；Alternatives Considered，写你比较过的方案和为什么没选；Risks 和 Rollout plan，包括 migration、监控和回滚；最后是 Open Questions。Non-goals 和 Alternatives 经常被省略，但 reviewer 最看重这两部分。",
            ),
            T(
                "VS Code 里怎么设置 format on save？",
                '打开 Settings，搜索 \'format on save\' 勾选上就行，或者在 settings.json 里加 "editor.formatOnSave": true。然后指定 formatter，比如 Python 用 Black 或 Ruff："[python]": {"editor.defaultFormatter": "charliermarsh.ruff"}。团队项目建议把配置放到 .vscode/settings.json 里提交，大家格式一致，PR 里就不会出现一堆无关的格式 diff。',
            ),
            T(
                "明天要给 VP present 项目进展，有点紧张，有什么 tips？",
                "开头 30 秒先讲结论：项目现在的状态、最大的风险、需要 VP 做什么决定。VP 时间很碎，先给 bottom line 再展开细节。准备好三个最可能被问的问题和答案。slides 少放字，一页一个观点。今晚对着计时器完整讲两遍，紧张感会降很多。被问到不知道的，就说 '我会后确认了发给您'，比硬答好。",
            ),
        ],
        dep=4,
        final="回到测试提速那个事，我准备开 -n 8 并行跑，按你当时说的，DB 那块要注意啥？",
        note="需要 pytest fixture 那一轮：session-scope 建 schema + function-scope transaction rollback，xdist 下每个 worker 用 worker_id 区分数据库名。",
    )
)

# m2 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-docker-image-size-multistage",
        lang="mixed",
        schema="openai.chat",
        system="You are a DevOps assistant. 用户会中英混用，你也可以。你可以用 run_shell 在项目 sandbox 里执行命令。",
        turns=[
            T(
                "帮我把这句 English 改得更 native 一点：'Please kindly revert back to me at your earliest convenience.'",
                "这句在 native speaker 看来有点啰嗦又老派：'kindly' 和 'please' 重复，'revert back' 是 Indian English 里常见的用法，美式英语一般理解为 '恢复原状'。可以改成 'Could you get back to me when you have a chance?'，如果比较急就说 'Could you let me know by Thursday?'。给具体的 deadline 比 'earliest convenience' 更有效。",
            ),
            T(
                "想给团队搞个 team building，人均预算 200，有啥建议？",
                "人均 200 可以做的不少：密室逃脱或者剧本杀，一般人均一百多，适合五到八人一组；周末去郊区徒步加农家乐午饭，交通用拼车；或者订个包间玩桌游加 pizza。如果团队里有人不爱社交，选有明确玩法的活动比单纯吃饭喝酒好。提前发个投票让大家选，参与度会高很多。",
            ),
            TOOL(
                "帮我看下现在 api 这个 image 多大，build 完感觉特别大，push 要好久。",
                [
                    (
                        "run_shell",
                        {
                            "cmd": "docker images api:latest --format '{{.Repository}}:{{.Tag}} {{.Size}}' && docker history api:latest --format '{{.Size}}\\t{{.CreatedBy}}' | head -8"
                        },
                        'api:latest 1.42GB\n0B\tCMD ["gunicorn" "-w" "4" "app:app"]\n58.3MB\tCOPY . /app\n312MB\tRUN pip install -r requirements.txt\n487MB\tRUN apt-get update && apt-get install -y build-essential gcc libpq-dev git\n0B\tWORKDIR /app\n0B\tENV PYTHONUNBUFFERED=1\n560MB\t(base) FROM python:3.11',
                    )
                ],
                "api:latest 现在是 1.42GB。大头在三层：base image 用的是完整版 python:3.11，约 560MB；apt-get 装 build-essential、gcc、libpq-dev、git 那一层 487MB；pip install 那一层 312MB。COPY 代码只有 58MB。也就是说编译工具链和 full base image 占了一大半，而这些东西 runtime 根本用不到。",
            ),
            T(
                "Python 里 list comprehension 和 generator expression 什么时候用哪个？",
                "要重复遍历、要 len() 或者下标访问、数据量不大，用 list comprehension，比如 [x*2 for x in items]。只遍历一次、数据量大或者是流式的，用 generator expression，(x*2 for x in items)，它是 lazy 的，不会一次性占内存。传给 sum()、any()、max() 这类函数时直接写 sum(x*2 for x in items) 就好，连括号都能省。",
            ),
            T(
                "周末带娃在上海玩，想找 indoor 的地方，下雨天也能去。",
                "上海自然博物馆和上海天文馆都很适合，一定要提前在公众号预约。三到六岁的可以去各大商场里的室内游乐场，比如 Kids Wonderland 这一类，或者去儿童职业体验馆。喜欢阅读的话，浦东图书馆和思南书局的童书区很舒服。大一点的孩子可以去上海科技馆，玩上大半天没问题。",
            ),
            T(
                "我 LinkedIn headline 怎么写比较好？现在是 Backend Engineer @ 某 fintech。",
                "headline 不只是职位，可以加上你的专长和价值，比如 'Backend Engineer @ Fintech | Payments, Distributed Systems, Go & Kafka'，这样 recruiter 搜关键词时更容易找到你。如果在看机会，可以加 'Open to Staff roles'，不过更推荐用 LinkedIn 的 Open to Work 只对 recruiter 可见的设置。别写 'Passionate about technology' 这种空话。",
            ),
            T(
                "Postgres 里 VARCHAR(255) 和 TEXT 有性能差别吗？",
                "在 Postgres 里基本没有性能差别，VARCHAR(n)、TEXT 底层存储是一样的，VARCHAR(n) 只是多了一个长度检查。很多人习惯写 255 是从 MySQL 带过来的。推荐直接用 TEXT，如果业务上真的需要限制长度，用 VARCHAR(n) 或者 CHECK constraint。要注意的是以后改 VARCHAR 的长度上限有时需要 rewrite 表，TEXT 就没这个问题。",
            ),
            T(
                "最近感觉有点 burn out，要不要请个长假？",
                "如果已经持续几周提不起劲、对工作很抵触、睡眠和情绪都受影响，请一段假是值得的。不过假期只能暂时缓解，回来后如果 workload 和压力来源不变，很快又会回到原点。休假前可以想清楚是哪些事情在消耗你，回来后和 manager 谈一谈调整。情况严重的话，也可以考虑找专业的心理咨询。",
            ),
            T(
                "咖啡喝多了会心慌，每天多少 caffeine 算安全？",
                "一般建议健康成年人每天咖啡因不超过 400mg，大约是三到四杯普通的美式，孕期建议不超过 200mg。但每个人对咖啡因的代谢速度差别很大，你喝了心慌说明比较敏感，可以先减到一天一杯，或者换成低因。注意奶茶、可乐、能量饮料里也有咖啡因，很容易不知不觉超量。",
            ),
            T(
                "git 里怎么把某个文件恢复到上一个 commit 的版本？",
                "如果只是想丢掉工作区里对这个文件的修改，用 git restore path/to/file。如果要恢复到上一个 commit 的内容：git restore --source=HEAD~1 path/to/file，老版本 git 用 git checkout HEAD~1 -- path/to/file。恢复后这个文件会变成 modified 状态，确认没问题再 commit。想恢复到任意 commit，把 HEAD~1 换成对应的 hash 就行。",
            ),
            T(
                "下周去 Singapore 出差，需要准备什么？",
                "中国护照去新加坡现在免签，最多停留 30 天，入境前三天内要在线填 SG Arrival Card。插座是英标三脚，记得带转换插头。天气很热很潮，但室内空调非常冷，带一件薄外套。交通很方便，直接用信用卡刷地铁和公交就行。注意口香糖不能带入境，公共场所禁烟规定很严。",
            ),
        ],
        dep=2,
        final="回到那个 image size 的问题，按之前 docker history 看到的那几层，换成 multi-stage 加 slim base 大概能降到多少？",
        note="需要 run_shell 工具结果：1.42GB，其中 python:3.11 base 560MB、apt build 工具 487MB、pip 312MB、代码 58MB。",
    )
)

# m3 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-react-useeffect-infinite-loop",
        lang="mixed",
        schema="anthropic.messages",
        blocks=True,
        system="You are a helpful coding and life assistant. The user often mixes Chinese and English; reply in the same style.",
        turns=[
            T(
                "想系统地学 system design，有什么 resource 推荐？",
                "入门可以看 Alex Xu 的 'System Design Interview' 两卷，案例很具体，每章一个系统。想打好底子一定要读 'Designing Data-Intensive Applications'，讲 replication、partitioning、consistency 这些核心概念，读完看很多设计都会通透。GitHub 上的 system-design-primer 适合当 checklist。再配合各大公司的 engineering blog，看真实系统是怎么演进的。",
            ),
            T(
                "周末想在家做 brunch，有什么简单又好看的？",
                "可以做 shakshuka，番茄洋葱甜椒炒成酱，打几个鸡蛋进去焖熟，整锅端上桌很出片，配烤过的酸面包。再加一份 avocado toast，撒点辣椒碎和柠檬汁。甜的可以做 Dutch baby，一锅烤出来的大松饼，撒糖粉和莓果。饮品准备冷萃咖啡或者鲜榨橙汁，半小时就能搞定。",
            ),
            T(
                "我 MacBook 电池 health 只有 78% 了，要不要换？",
                "Apple 的标准是容量低于 80% 就属于需要维修的状态，系统里可能会显示 'Service Recommended'。如果你日常续航还够用，比如一天插电用为主，可以先不换。如果出门用半天就没电，或者出现突然关机，那就值得换，官方换电池价格大概一千多人民币，比换新电脑划算。记得换之前先做好 Time Machine 备份。",
            ),
            T(
                "Interview 的时候被问 'why are you leaving'，怎么答比较好？",
                "核心是往前看，说你想要什么，而不是抱怨现在有什么不好。比如：'我在现在的团队做了三年 payment infra，学到很多，但接下来我想在更大规模的系统上做 ownership 更强的事情，你们的这个岗位刚好匹配。'避免吐槽老板和同事，即使是真的。如果是被裁，直接说组织调整就好，不用多解释。",
            ),
            T(
                "CSS 里 flex 和 grid 什么时候用哪个？",
                "简单的判断方法：一维布局用 flex，二维布局用 grid。比如一排按钮、导航栏、让元素垂直居中，用 flex 就够了；整个页面的区域划分、卡片网格、需要行和列同时对齐的布局，用 grid 更清晰。两者经常一起用：外层用 grid 排版，里面的组件用 flex 对齐内容。现代浏览器对两者支持都很好。",
            ),
            T(
                "怎么说服 PM 在 sprint 里给 tech debt 留点 capacity？",
                "用 PM 关心的语言讲：不要说 '代码很烂要重构'，而是说 '这个模块每次改需求要多花两天，上个季度因为它出了三次线上 bug'。把 tech debt 和交付速度、稳定性、客户体验挂钩，最好有数据。提一个固定比例的方案，比如每个 sprint 留 15% 到 20%，比每次单独争取容易得多。做完之后也要汇报效果。",
            ),
            T(
                "我这个 React component 一直 re-render 停不下来，useEffect 里 fetch 完 setData，deps 里放了 options，options 是 parent 传进来的 object。",
                "问题就在 options：parent 每次 render 都会 new 一个新的 object，reference 变了，useEffect 就认为 deps 变了重新跑，fetch 完 setData 又触发 re-render，形成 loop。解决办法：在 parent 用 useMemo 把 options 包起来，或者 deps 里只放 primitive，比如 options.page 和 options.pageSize。也可以把 options JSON.stringify 之后当 dep，但不太推荐。顺便在 effect 里加个 AbortController，unmount 的时候 abort 掉请求。",
            ),
            T(
                "最近想开始 running，配速怎么定？",
                "新手大部分时间应该跑 easy pace，也就是能边跑边说完整句子的速度，心率大概在最大心率的 60% 到 70%。很多人一开始跑太快，很快就受伤或者放弃。可以先用跑走结合，比如跑三分钟走一分钟，每周三次，每周总量增加不超过 10%。等能连续跑 30 分钟，再加一次稍快的节奏跑。",
            ),
            T(
                "Notion 和 Obsidian 记笔记哪个好？",
                "看你的使用场景。Notion 强在协作和结构化，database、看板、模板很方便，适合团队知识库和项目管理，但数据在云端，离线体验一般。Obsidian 是本地 Markdown 文件，速度快，双向链接和 graph view 适合做个人知识管理，数据完全在自己手里，插件生态也很丰富。很多人工作用 Notion、个人笔记用 Obsidian。",
            ),
            T(
                "下个月去 Bali，有什么 must-do？",
                "Ubud 待两三天：看 Tegallalang 梯田、去 monkey forest、凌晨爬 Mount Batur 看日出。然后去南边的 Uluwatu 看悬崖上的 Kecak 火舞，顺便冲浪或者在 beach club 看日落。想潜水或浮潜可以去 Nusa Penida，看 manta ray。交通主要靠 Grab 或者包车司机，Bali 交通很堵，行程别排太满。",
            ),
            T(
                "npm 和 pnpm 有啥区别，值得切吗？",
                "pnpm 用一个全局的 content-addressable store，依赖只存一份，通过 hard link 装进项目，所以安装更快、占的磁盘少很多。它的 node_modules 结构更严格，没在 package.json 里声明的依赖不能直接用，可以避免 phantom dependency 的问题。monorepo 的 workspace 支持也很好。切换成本不高，大部分项目直接 pnpm import 就能迁过去。",
            ),
            T(
                "家里想换个 Wi-Fi 6 router，有什么推荐？",
                "房子不大、一百平以内，一台中高端的 Wi-Fi 6 路由器就够了，比如 TP-Link 或者华硕的 AX 系列。如果户型比较长或者墙多，推荐直接上 mesh 套装，比如华硕的 ZenWiFi 或者 TP-Link Deco，两个节点基本能覆盖全屋。家里有预埋网线的话，用有线回程效果最好。买之前确认一下你的宽带是不是千兆。",
            ),
            T(
                "Code review 的时候怎么给 senior 提意见不尴尬？",
                "用提问代替断言，比如 '这里如果 list 是空的会怎么样？' 而不是 '这里有 bug'。针对代码不针对人，附上理由或者文档链接。分清楚 blocking 和 nit，小的风格问题标成 'nit:'，对方压力会小很多。其实大部分 senior 都欢迎有质量的 review，认真看代码本身就是一种尊重。",
            ),
        ],
        dep=6,
        final="之前那个 re-render 停不下来的 component，如果传 object 的那个 parent 是第三方库，我改不了，还能怎么搞？",
        note="需要 useEffect 那一轮：parent 每次 new object 导致 deps 变；改不了 parent 时只能把 deps 换成 primitive 字段或 stringify。",
    )
)

# m4 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-git-interactive-rebase",
        lang="mixed",
        schema="openai.chat",
        system="你是一个工程效率助手，用户习惯中英混用。",
        turns=[
            T(
                "下周有新人入职，onboarding 第一周的 checklist 怎么列？",
                "Day 1：开通账号和权限，laptop、VPN、GitHub、Slack、Jira 都要提前申请好，安排一个 buddy。Day 2 到 3：跑通本地开发环境，读 architecture overview，跟每个组员 15 分钟 1:1。Day 4 到 5：领一个 good first issue，完整走一遍 PR、review、deploy 流程。周五和 manager 做个 check-in，收集 onboarding 文档里过时的地方。",
            ),
            T(
                "我的 feature branch 有 12 个 commit，好多是 'fix typo' 'wip'，merge 之前想整理成两三个干净的 commit，怎么做？",
                "用 interactive rebase：先 git fetch，然后 git rebase -i origin/main，编辑器里会列出这 12 个 commit。想保留的标成 pick，要合并进前一个的改成 squash（会保留 message 让你编辑）或者 fixup（直接丢掉它的 message）。保存退出后按提示改 commit message。因为 history 改了，push 的时候要用 git push --force-with-lease，比 --force 安全，能防止覆盖别人刚 push 的东西。",
            ),
            T(
                "每天 standup 都拖到 30 分钟，怎么 keep it short？",
                "规定每个人只说三件事：昨天做了什么、今天做什么、有没有 blocker，每人一分钟以内。一旦开始讨论细节，就说 'let's take it offline'，standup 结束后相关的人留下来继续聊。可以按 board 上的 ticket 走，而不是按人轮流。设一个 timer，准时开始准时结束。如果人太多，考虑拆成两个小组或者改成 async update。",
            ),
            T(
                "我想在家装个 home server 跑 Jellyfin，需要什么配置？",
                "Jellyfin 本身很轻量，关键看要不要 transcode。如果客户端都能 direct play，一台 N100 的 mini PC 加 16GB 内存就绰绰有余，功耗只有十几瓦。需要把 4K 转码给手机看的话，Intel 带 Quick Sync 的核显就能搞定硬件转码，比纯 CPU 强很多。存储看片库大小，接一个 USB 硬盘柜或者直接挂 NAS 的共享目录都行。",
            ),
            T(
                "Go 里 goroutine leak 一般怎么排查？",
                "先用 pprof 看 goroutine 数量是不是一直在涨：import net/http/pprof，访问 /debug/pprof/goroutine?debug=2，能看到每个 goroutine 卡在哪一行。常见原因是往没人读的 channel 里写、等一个永远不会关闭的 channel、或者 HTTP 请求没设 timeout。修法通常是所有 goroutine 都接收 context，用 select 监听 ctx.Done()。测试里可以用 uber-go/goleak 自动检测。",
            ),
            T(
                "最近颈椎疼，monitor 高度怎么调？",
                "坐直的时候，屏幕最上面那一行大概和眼睛平齐或者稍低一点，这样看屏幕中间时视线会自然往下 10 到 20 度。屏幕离眼睛一臂左右的距离。笔记本直接放桌上太低了，一定要用支架加外接键盘鼠标。双屏的话主屏放正中间。再好的姿势也要每半小时起来动一动，做几个收下巴的动作。",
            ),
            T(
                "帮我想个 side project 的名字，是一个记账的 CLI tool。",
                "几个方向：简洁型的 'ledgr'、'tally'、'spendr'；有点梗的 'penny'、'beancounter'；中文谐音的 'zhangben'（账本）。CLI 工具的名字最好短，好打，不和常见命令冲突，可以先在 crates.io、PyPI 或者 npm 上搜一下有没有被占用。'tally' 读起来顺，子命令写成 tally add、tally report 也很自然。",
            ),
            T(
                "Kubernetes 里 liveness probe 和 readiness probe 有什么区别？",
                "readiness probe 决定 pod 能不能接流量，失败了就从 Service 的 endpoints 里摘掉，但不会重启，适合启动预热、依赖暂时不可用的情况。liveness probe 决定容器是不是已经卡死，失败了 kubelet 会直接重启容器。常见的坑是 liveness 设得太激进，或者检查了下游依赖，结果下游一抖所有 pod 一起重启。启动慢的应用再加一个 startup probe。",
            ),
            T(
                "年底 performance review 的 self-assessment 怎么写？",
                "按 impact 来组织，而不是按时间列流水账。挑三到五件最重要的事，每件写清楚背景、你做了什么、结果是什么，尽量量化，比如 latency 降了多少、省了多少成本。对照公司的 level 标准，写出你在哪些方面已经有下一级的表现。也要诚实写一两个成长点和计划。平时就记一个 brag document，年底写起来会轻松很多。",
            ),
            T(
                "想给爸妈买个 iPad，哪个型号合适？",
                "给爸妈用，基础款 iPad 就完全够了，看视频、视频通话、刷新闻都很流畅，价格也最友好。屏幕大一点对老人更友好，不建议买 mini。存储选 128GB 左右，照片视频多的话再往上加。记得帮他们把字体调大、开启缩放，设置好 FaceTime 和微信视频，再配一个带支架的保护套，放桌上看很方便。",
            ),
        ],
        dep=1,
        final="刚才那个整理 history 的操作，两个关键字里哪个会把 message 直接扔掉？push 的时候那个更安全的参数叫啥来着？",
        note="间接提到 interactive rebase（“整理 history 的操作”）；需要那一轮：fixup 丢弃 message、squash 保留，push 用 --force-with-lease。",
    )
)

# m5 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-ci-flaky-timeout-test",
        lang="mixed",
        schema="anthropic.messages",
        system="You are a CI/CD assistant with access to fetch_ci_log. 用户会中英混用，请用同样的风格回复。",
        turns=[
            T(
                "帮我写个 Slack 消息，提醒大家周五 code freeze。",
                "可以这样发：'Reminder: 本周五 (6/20) 18:00 开始 code freeze，直到下周二 release 完成。freeze 期间 main 只接受 release blocker 的 fix，需要 merge 的请先在 #release 频道 @oncall 说明原因。还没 merge 的 PR 请尽量在周五中午前搞定。Thanks!' 加上具体的时间和例外流程，大家就不会来回问了。",
            ),
            T(
                "杭州周末有什么适合 hiking 的路线？",
                "比较经典的是九溪十八涧到龙井村，沿着溪水走，路很平，三四个小时很舒服。想爬得多一点，可以走北高峰经韬光寺到灵隐，或者走西湖群山的十里琅珰，山脊线风景很好。再远一点的有临安的大明山。周末人多，建议早上八点前出发，带好水，雨后石阶比较滑。",
            ),
            T(
                "SQL 里 LEFT JOIN 之后在 WHERE 里过滤右表字段，为什么结果变得跟 INNER JOIN 一样？",
                "因为 LEFT JOIN 里没匹配上的行，右表字段都是 NULL，WHERE b.status = 'active' 这种条件对 NULL 的结果不是 true，这些行就被过滤掉了，效果等同 INNER JOIN。如果你想保留左表所有行、只是让右表按条件匹配，就把条件挪到 ON 里：LEFT JOIN b ON a.id = b.a_id AND b.status = 'active'。WHERE 是在 join 之后过滤，ON 是 join 时的匹配条件。",
            ),
            T(
                "Python 的 dataclass 和 pydantic model 怎么选？",
                "纯内部的数据容器、不需要校验，用 dataclass，它是标准库，零依赖，速度快。数据来自外部，比如 API request、配置文件、JSON，需要校验和类型转换，用 pydantic，它会帮你把 '42' 转成 int，校验失败给出清楚的错误信息，还能直接导出 JSON schema。FastAPI 这类框架已经深度集成 pydantic。两者也可以混着用。",
            ),
            T(
                "1:1 的时候怎么跟 manager 要 promotion 的 feedback？",
                "直接但具体地问：'我希望在明年中之前到 senior，你觉得我现在离 senior 的标准还差哪些？能不能给我一两个具体的例子？' 然后一起定几个可以证明能力的项目或者行为，约定每个月 check 一次进度。把谈话内容整理成文字发给 manager 确认，这样到 promo cycle 的时候有据可查，也避免目标变来变去。",
            ),
            TOOL(
                "帮我看下 job 88213 为什么挂了，这个 PR 只改了 README 啊。",
                [
                    (
                        "fetch_ci_log",
                        {"job_id": "88213"},
                        "job 88213 (pytest, py3.11) FAILED after 14m02s\n=== short test summary info ===\nFAILED tests/integration/test_payment_retry.py::test_timeout_retry - AssertionError: expected 3 retries, got 2\n1 failed, 1482 passed, 12 skipped in 838.41s\n--- history ---\ntests/integration/test_payment_retry.py::test_timeout_retry failed in 3 of the last 20 runs on main (flaky rate 15%)\n--- timing ---\ntest_timeout_retry duration 5.02s (per-test timeout budget 5.0s, retry backoff 1s/2s/4s)",
                    )
                ],
                "挂的是 tests/integration/test_payment_retry.py::test_timeout_retry，assert 期望 3 次 retry，实际只有 2 次，其他 1482 个 test 都过了。跟你改 README 没关系：这个 test 在 main 上最近 20 次里挂了 3 次，flaky rate 大约 15%。而且它跑了 5.02s，刚好超过 5.0s 的 timeout budget，retry backoff 是 1s/2s/4s 累加，CI runner 稍微慢一点，第三次 retry 就来不及发生。",
                pre="我拉一下这个 job 的 log。",
            ),
            T(
                "午饭后特别困，下午怎么保持 focus？",
                "午饭别吃太撑，少吃精制碳水，多点蛋白质和蔬菜，血糖不会大起大落。饭后出去走十分钟，晒晒太阳比咖啡还提神。可以午睡 15 到 20 分钟，别超过 30 分钟，不然醒来更昏。下午把需要深度思考的任务放在两三点以后，刚吃完饭那段时间处理邮件、回消息这种轻任务。",
            ),
            T(
                "Terraform 的 state 文件放哪里比较好？",
                "团队使用一定要用 remote backend，别放在本地或者提交到 git 里，state 里可能有明文的 secret。AWS 上最常见的是 S3 加 DynamoDB 做 state locking，防止两个人同时 apply；GCP 用 GCS backend 自带 locking；也可以用 Terraform Cloud。S3 bucket 要开 versioning 和加密，权限收紧。按环境拆分 state，比如 dev、staging、prod 各自一个 key。",
            ),
            T(
                "给新人做 mentor 的时候，怎么平衡 hands-on 带和让他自己探索？",
                "前两周多给 context 和 pairing，让他看你怎么拆问题、查代码、debug。之后逐渐放手：给一个有明确边界的任务，约定一个 timebox，比如卡住超过两个小时就来问，不要一个人憋一整天。review 的时候多问 '你为什么这么选'，而不是直接给答案。每周留半小时 1:1，聊进展也聊困惑。",
            ),
            T(
                "Redis 的 SETNX 做分布式锁有什么坑？",
                "几个常见的坑：第一，SETNX 和 EXPIRE 分两步不是原子的，进程挂在中间锁就永远不释放，要用 SET key value NX PX 30000 一步完成。第二，释放锁时要校验 value 是不是自己的，用 Lua 脚本先 GET 比较再 DEL，否则可能删掉别人的锁。第三，业务执行时间超过过期时间，锁会提前失效，需要 watchdog 续期。主从切换时锁也可能丢。",
            ),
            T(
                "周末想学做 pour-over coffee，需要哪些器材？",
                "入门套装：一个 V60 或者 Kalita 滤杯、对应的滤纸、一个细嘴手冲壶、一个带计时的电子秤，再加一台磨豆机，手摇的就行，比如 Timemore 栗子 C 系列。豆子买烘焙日期两周以内的浅中烘。起步参数可以用 15 克豆、240 克 92 度左右的水，先闷蒸 30 秒，总时间两分半左右，再根据口味调研磨度。",
            ),
            T(
                "Grafana dashboard 怎么加 alert？",
                "新版 Grafana 用的是 unified alerting：在 panel 的编辑界面切到 Alert tab，点 'New alert rule'，选数据源和 query，设置条件，比如 p99 latency 大于 500ms 持续 5 分钟。然后配置 contact point，比如 Slack webhook、PagerDuty 或者邮件，再用 notification policy 按 label 路由。建议 alert rule 加上 runbook 链接，on-call 收到时知道怎么处理。",
            ),
            T(
                "想读点 non-tech 的书放松一下，有推荐吗？",
                "小说可以看石黑一雄的《长日将尽》或者《克拉拉与太阳》，安静又有余味；东野圭吾的《解忧杂货店》很治愈。非虚构推荐《人类简史》和何伟的《江城》，写他在涪陵教书的两年，很有画面感。想轻松一点，可以读村上春树的随笔集《旋转木马鏖战记》，一篇十几分钟，睡前刚好。",
            ),
            T(
                "Markdown 表格怎么让某一列右对齐？",
                "在表头下面那一行分隔线里用冒号控制对齐：'---:' 是右对齐，':---' 是左对齐，':---:' 是居中。比如 '| Name | Amount |' 下面写 '| :--- | ---: |'，Amount 那一列就会右对齐，数字看起来整齐很多。注意有些 Markdown 渲染器对表格的支持不同，GitHub、Typora、Obsidian 都支持这种写法。",
            ),
        ],
        dep=5,
        final="回到那个挂掉的 job，那个 flaky test 直接加个 pytest-rerunfailures 的 retry 合适吗，还是应该从它的 timing 下手？",
        note="需要 fetch_ci_log 工具结果：test_timeout_retry 期望3次实际2次，main 上 flaky 15%，耗时 5.02s 超过 5.0s budget，backoff 1s/2s/4s。",
    )
)

# m6 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-kafka-consumer-lag-partitions",
        lang="mixed",
        schema="openai.chat",
        system="你是一个后端和数据工程助手。User 会中英文混着问，你可以用同样的风格回答。",
        turns=[
            T(
                "帮我把这句翻成 English 的 release note：'修复了导出 CSV 时中文乱码的问题'",
                "可以写成：'Fixed garbled Chinese characters in exported CSV files.' 如果想说得更具体一点，可以加上原因：'Fixed an issue where Chinese characters appeared garbled when opening exported CSV files in Excel (CSV is now UTF-8 with BOM).' release note 一般用过去式动词开头，面向用户描述现象，而不是内部实现细节。",
            ),
            T(
                "北京哪里有好吃的 brunch？周末想和朋友去。",
                "三里屯和亮马河一带选择最多，很多店有户外座位，天气好的时候很舒服。国贸附近有几家澳洲风格的 café，avocado toast 和 flat white 都做得不错。想安静一点可以去胡同里的小店，比如鼓楼和五道营附近，环境很有氛围。周末十一点以后排队比较久，建议十点前到，或者提前在大众点评上订位。",
            ),
            T(
                "Python 里 asyncio 和 threading 怎么选？",
                "都适合 I/O-bound 的任务，CPU-bound 两个都不行，要用 multiprocessing。asyncio 是单线程的协作式调度，适合大量并发连接，比如几千个 HTTP 请求或者 WebSocket，开销小，但要求整个调用链都是 async 的库。threading 更适合要调用阻塞式的老库、并发量不大的场景，写起来简单，但要注意共享状态的线程安全。",
            ),
            T(
                "我们 Kafka consumer lag 一直在涨，topic 有 12 个 partition，consumer group 只有 3 个 instance，每条 message 处理大概 50ms，怎么提速？",
                "先算一下：每个 instance 单线程处理，一条 50ms，每秒最多 20 条，3 个 instance 总共大约 60 msg/s，每个 instance 负责 4 个 partition。最直接的是把 instance 扩到 12 个，跟 partition 数对齐，吞吐大约翻 4 倍；超过 12 个没用，多出来的会 idle。其次看 50ms 花在哪，如果是调下游 HTTP，可以 batch，或者在 instance 内部按 key 并发处理。同时调大 max.poll.interval.ms，避免处理慢被踢出 group 触发 rebalance。",
            ),
            TOOL(
                "帮我搜下 Flink 1.19 是什么时候 release 的。",
                [
                    (
                        "search_web",
                        {"query": "Apache Flink 1.19.0 release date"},
                        "1. flink.apache.org: Announcing the Release of Apache Flink 1.19 - March 18, 2024\n2. Highlights: dynamic source parallelism inference for batch jobs, per-operator state TTL in SQL, mini-batch optimization for regular joins.",
                    )
                ],
                "Apache Flink 1.19.0 是 2024 年 3 月 18 日发布的。这个版本比较重要的更新包括：batch job 的 source 并行度可以动态推断，Flink SQL 支持给单个 operator 设置 state TTL，以及 regular join 的 mini-batch 优化。如果你们要升级，记得先看一下 release notes 里的 deprecation 列表。",
            ),
            T(
                "我想跳槽去 big tech，LeetCode 刷多少题够？",
                "数量不是关键，覆盖模式更重要。一般建议 150 到 250 题，把常见的 pattern 吃透：two pointers、sliding window、BFS/DFS、binary search、heap、DP、graph、union find。可以按 NeetCode 150 这类清单刷，每道题做完总结思路。后期多做 mock interview，练边说边写，面试里讲清楚思路和复杂度比一次写对更重要。",
            ),
            T(
                "每天对着屏幕眼睛很干，有啥办法？",
                "试试 20-20-20 原则：每 20 分钟看 20 英尺，也就是六米外的地方 20 秒。盯屏幕的时候眨眼次数会大幅减少，所以要有意识地多眨眼。屏幕亮度和环境光接近，别太亮。可以用不含防腐剂的人工泪液。空调房里放个加湿器。如果一直很严重，去眼科查一下是不是睑板腺的问题。",
            ),
            T(
                "MySQL 8 在 prod 上加一个 column 会锁表吗？",
                "MySQL 8.0 起很多 ALTER 支持 ALGORITHM=INSTANT，在表的最后加一个可为 NULL 或者有默认值的 column 基本是秒级完成的，只改 metadata，不会 copy 表。8.0.29 以后还支持在任意位置 instant 加列。不过执行时仍然需要短暂拿 metadata lock，如果有长事务没提交，ALTER 会被卡住，后面的查询也会排队。执行前先查一下有没有 long running transaction。",
            ),
            T(
                "线上出了个 incident，postmortem 怎么写比较好？",
                "核心是 blameless，关注系统和流程，而不是追究某个人。结构一般是：summary，一段话说清楚影响范围和时长；timeline，精确到分钟，从触发到发现到恢复；root cause，多问几个 why；what went well 和 what went wrong；最后是 action items，每一项都要有 owner 和 deadline。写完在团队里 review 一遍，action items 要跟进落实。",
            ),
            T(
                "周末想做 meal prep，一次做五天的午饭，有什么菜谱？",
                "可以做三样轮换：一锅咖喱鸡腿肉配土豆胡萝卜；一盘烤鸡胸或者三文鱼配烤西兰花、南瓜；再卤一锅牛腱子。主食用糙米或者藜麦，一次煮好分装。绿叶菜不适合提前做，可以每天早上花五分钟焯一下。分装到玻璃饭盒里冷藏，前三天的放冷藏，后两天的可以先冷冻，前一晚拿出来解冻。",
            ),
            T(
                "S3 的 storage class 怎么选？",
                "经常访问的数据用 Standard；访问模式不确定的用 Intelligent-Tiering，它会自动在不同层之间移动，省心。一个月访问不到一次但要快速取回的，用 Standard-IA。归档数据用 Glacier Instant Retrieval、Flexible Retrieval 或者 Deep Archive，越往后越便宜，但取回越慢、越贵。注意 IA 和 Glacier 有最短存储期和最小对象大小的收费规则。",
            ),
            T(
                "我们组要招 intern，JD 怎么写比较吸引人？",
                "开头用两三句话讲清楚 intern 会做什么真实的项目，比如 '你会参与我们实时推荐系统的特征平台开发，代码会上线服务几百万用户'，比空泛的 '参与公司核心业务' 有吸引力得多。要求分成 must-have 和 nice-to-have，别列一长串。写上 mentor 制度、转正机会、实习补贴和是否远程。语气可以轻松一点。",
            ),
            T(
                "Spark 里 repartition 和 coalesce 有什么区别？",
                "repartition 会做一次 full shuffle，可以增加也可以减少分区数，数据分布会比较均匀，但开销大。coalesce 只能减少分区，它会尽量把相邻的分区合并，不做 full shuffle，所以快很多，但可能导致分区大小不均。常见用法是：写文件前想减少小文件，用 coalesce；数据严重倾斜或者需要按某个 key 重新分布，用 repartition。",
            ),
            T(
                "孩子想学编程，几岁开始合适？用 Scratch 还是 Python？",
                "六到十岁可以从 Scratch 开始，拖积木块就能做动画和小游戏，重点培养逻辑思维和兴趣，不用担心语法。十岁以上、打字比较熟练的，可以过渡到 Python，语法简单，可以做小游戏、画图、处理数据。关键是让孩子做自己感兴趣的小项目，而不是刷题。每周一两次、每次一小时左右就够了。",
            ),
            T(
                "实时 OLAP 用 ClickHouse 还是 Druid？",
                "ClickHouse 部署和运维相对简单，SQL 支持很完整，单表聚合查询非常快，适合大多数日志分析、用户行为分析场景，社区也很活跃。Druid 更偏向实时 ingestion 和高并发、低延迟的时序查询，和 Kafka 集成很成熟，但架构组件多，运维复杂。如果团队规模不大，又没有特别高的并发要求，一般优先考虑 ClickHouse。",
            ),
            T(
                "出差总是 jet lag，有什么办法？",
                "出发前两三天就开始往目的地时区调整作息，每天提前或推后一小时睡。上飞机后把手表调到当地时间，按当地时间吃饭睡觉。到了以后白天尽量多晒太阳，晚上再睡，白天实在困只睡二十分钟。避免酒精，少喝咖啡。有些人用低剂量的褪黑素帮助调整，可以问一下医生是否适合你。",
            ),
        ],
        dep=3,
        final="之前那个 lag 的问题，如果我直接把 consumer 扩到 20 个 instance 行不行？还是得先动 topic？",
        note="需要 Kafka lag 那一轮：topic 只有 12 个 partition，超过 12 个 consumer 会 idle，要扩到 20 需先加 partition。",
    )
)

# m7 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-travel-japan-jrpass-hakone",
        lang="mixed",
        schema="openai.chat",
        system="你是一个旅行和生活助手，用户习惯中英混用。",
        turns=[
            T(
                "我们 team 的 sprint retro 总是没人说话，怎么 facilitate 比较好？",
                "先让大家匿名写，比如用 EasyRetro 或者 Miro 的便利贴，每人五分钟写 what went well、what didn't、ideas，然后再一起分组讨论，不敢开口的人也能表达。换换形式，比如 Start/Stop/Continue 或者 Sailboat。manager 最好最后发言，避免定调。每次 retro 只挑一两个 action item，并在下次开头回顾有没有落实，大家才会觉得说了有用。",
            ),
            T(
                "帮我看下这个 regex：^\\d{3}-\\d{4}$ 能匹配香港的电话号码吗？",
                "不能。香港的电话号码是 8 位数字，通常写成 '9123 4567' 这样中间一个空格，或者直接连着写 '91234567'，你这个 regex 只匹配 '123-4567' 这种 3 位加 4 位的格式。可以改成 ^\\d{4}[ -]?\\d{4}$，允许中间有空格、横杠或者没有分隔。如果还要兼容 +852 前缀，前面加上 (\\+852[ -]?)?。",
            ),
            T(
                "最近想开始 strength training，一周练几次比较好？",
                "新手一周三次全身训练就很好，比如周一、周三、周五，每次 45 到 60 分钟，中间留一天恢复。每次练几个复合动作：深蹲、硬拉或者罗马尼亚硬拉、卧推、划船、推举，每个动作三组，每组八到十二次。重点是动作标准和渐进超负荷，每周稍微加一点重量或者次数。练三个月以后再考虑分化训练。",
            ),
            T(
                "给女朋友挑生日礼物，预算 2k RMB，她喜欢 design 类的东西。",
                "可以考虑有设计感的实用物件：一盏 Flos 或者 Muuto 的小台灯，放在桌上每天都能用；一只 Stelton 或者 Alessi 的设计款水壶；或者一本她喜欢的设计师作品集配一张设计展的门票。也可以去找独立设计师品牌的首饰，比大牌更特别。如果她喜欢平面设计，Pantone 相关的周边或者一套好的绘图工具也很贴心。",
            ),
            T(
                "AirPods 连 Mac 总是断，怎么办？",
                "先在 Mac 的蓝牙设置里把 AirPods 'Forget This Device'，然后把 AirPods 放回充电盒，长按背面按钮到指示灯闪白色，重新配对。如果同时登录了 iPhone 和 iPad，自动切换功能有时会把它抢走，可以在 AirPods 设置里把 'Connect to This Mac' 改成 'When Last Connected to This Mac'。Mac 附近的 USB 3 设备和 2.4GHz Wi-Fi 也可能造成干扰。",
            ),
            T(
                "Excel 的 XLOOKUP 和 VLOOKUP 有什么区别？",
                "XLOOKUP 是 VLOOKUP 的升级版：不需要数列号，直接指定查找列和返回列，插入或删除列也不会出错；可以往左查；默认就是精确匹配，不用记得写 FALSE；找不到时可以直接指定返回值，比如 'Not found'；还可以从后往前查找。缺点是只有 Excel 2021 和 365 才支持，文件要给用老版本的同事的话还是用 VLOOKUP 或者 INDEX/MATCH。",
            ),
            T(
                "怎么准备 behavioral interview？",
                "准备 6 到 8 个自己的真实故事，覆盖常见主题：conflict、failure、leadership、ambiguity、tight deadline、influence without authority。每个故事用 STAR 结构组织，重点放在你自己做了什么和结果，尽量量化。同一个故事可以从不同角度回答多个问题。对着镜子或者录音练习，控制在两分钟左右。Amazon 的话要对照 Leadership Principles 准备。",
            ),
            T(
                "下个月去日本 7 天，东京进大阪出，中间想去京都和箱根，JR Pass 还值得买吗？",
                "2023 年 10 月 JR Pass 涨价之后，7 日全国版普通车厢是 50,000 日元，而东京到京都的新干线单程大约 14,000 日元，京都到大阪几百日元，箱根那段主要坐小田急，不在 JR Pass 范围内。你这条线路 JR 总共也就一万五左右，远远不到回本线，所以不建议买。东京到京都单买新干线票，箱根买小田急的 Hakone Free Pass，从新宿出发两日券 6,100 日元左右，包含往返电车、登山电车、缆车、空中索道和芦之湖海盗船。",
            ),
            T(
                "周末 hiking 之前一天吃什么比较好？",
                "前一天晚餐多吃一点碳水，比如米饭、面条、土豆，给肌肉储备糖原，但别吃得太油腻或者太撑，也别尝试没吃过的东西，免得肠胃出问题。多喝水，少喝酒。当天早餐吃燕麦、香蕉、鸡蛋这类好消化的，出发前一个小时吃完。路上带坚果、能量棒、水果干，每隔一小时补充一点。",
            ),
            T(
                "Python 的 virtualenv 和 conda 怎么选？",
                "纯 Python 项目、依赖都能从 PyPI 装，用 venv 或者 uv 就够了，轻量、快、和 pip 生态完全兼容。如果你做 data science，需要 CUDA、MKL、GDAL 这类带 C/C++ 库的依赖，或者要管理不同的 Python 版本，conda（或者更快的 mamba）会省很多事。尽量不要在同一个环境里混用 conda install 和 pip install，容易出依赖冲突。",
            ),
            T(
                "跟 landlord 谈 renew lease，能不能压价？",
                "可以试试，尤其是你一直按时交租、没出过问题的话，对房东来说换租客有空置期和中介费的成本。谈之前查一下周边同类房子的租金，如果市场在降，就拿具体的房源做依据。可以提出续签两年换取不涨价或者小幅降价，或者请房东更换旧家电。提前两个月开始谈，给双方留时间，语气友好、表达想长期住的意愿。",
            ),
            T(
                "看完 Oppenheimer 想了解更多 Manhattan Project，推荐什么书？",
                "电影就是根据 'American Prometheus' 改编的，Kai Bird 和 Martin Sherwin 写的 Oppenheimer 传记，细节更丰富，推荐先读。想了解整个项目的全貌，Richard Rhodes 的 'The Making of the Atomic Bomb' 是经典，拿过普利策奖，从物理学的发展一路讲到广岛。轻松一点的可以看 'The Girls of Atomic City'，讲橡树岭工厂里的女性员工。",
            ),
        ],
        dep=7,
        final="回到日本 trip 的行程，去泡温泉那一段你推荐买的那张 pass，大概多少钱？能 cover 哪些交通？",
        note="间接提到箱根（“去泡温泉那一段”）；需要 JR Pass 那一轮：Hakone Free Pass 新宿出发两日券约6,100日元，含电车、登山电车、缆车、索道、海盗船。",
    )
)

# m8 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-okr-activation-q3",
        lang="mixed",
        schema="anthropic.messages",
        system="You are a helpful assistant for a product team lead. 用户中英混用，回答可以同样混用。",
        turns=[
            T(
                "我下周要 present quarterly business review，slides 多少页比较合适？",
                "一般 30 分钟的 QBR，正文控制在 10 到 15 页，其他细节放 appendix。结构可以是：一页 executive summary 放结论和关键数字；三四页讲 key metrics 和 trend；两三页讲本季度的 wins 和 misses，以及原因；两页讲下季度的 plan 和需要的 support。每页一个 headline 直接写结论，比如 'Retention 提升 4pt，主要来自新 onboarding'。",
            ),
            T(
                "周末想在家做个 spa day 放松一下，有啥建议？",
                "早上睡到自然醒，做一顿慢慢吃的早餐。然后泡个澡，加一点泡澡盐或者精油，放喜欢的 playlist。泡完敷个面膜，做一下手部和脚部护理。下午做 20 分钟的 yoga 或者拉伸，再读本书或者午睡。晚上点个好吃的外卖，看一部轻松的电影。关键是把手机调成勿扰模式，别看工作消息。",
            ),
            T(
                "帮我看下 Q3 OKR 怎么写，目标是提升新用户 activation，现在 7-day activation rate 是 22%。",
                "Objective 写成方向性的：'让新用户在第一周就体验到核心价值'。KR 要可衡量：KR1，7-day activation rate 从 22% 提升到 30%；KR2，onboarding checklist 的完成率从 45% 提升到 65%；KR3，新用户首次创建 project 的 median time 从 3 天缩短到 1 天以内。注意 KR 别写成 task，比如 '上线新版 onboarding' 是 initiative，不是 KR。每个 KR 指定一个 owner，每两周 check-in 一次 confidence。",
            ),
            T(
                "怎么写一个好的 PRD？",
                "一个好的 PRD 先讲清楚 why：要解决的用户问题、背景数据、为什么现在做。然后是 goals 和 success metrics，以及 non-goals。接着写 user stories 或者关键场景，附上 wireframe 或者流程图。requirements 分优先级，比如 P0 必须有、P1 最好有。最后列出 open questions、依赖和上线计划。保持简洁，写完先找 engineering lead 和 designer 过一遍。",
            ),
            T(
                "团队里有个 engineer 最近 performance 下滑，我该怎么开口聊？",
                "找一个私下的 1:1，先从关心开始而不是直接批评：'最近感觉你状态和之前不太一样，想听听你那边的情况。' 很多时候背后有个人原因或者对项目的困惑。然后用具体的事实说明你观察到的变化，比如最近两个 sprint 的交付情况，而不是给人贴标签。一起定一两个具体的改进目标和支持方式，约好两周后再 check。",
            ),
            T(
                "推荐几个关于 product management 的 podcast。",
                "'Lenny's Podcast' 是现在最火的，嘉宾都是各大公司的 product leader，干货很多。'This is Product Management' 话题覆盖面广，每集不长。'Masters of Scale' 是 Reid Hoffman 主持的，更偏创业和增长。中文的话可以听 '产品沉思录' 相关的节目，或者 '三五环'，偶尔会聊产品和创业。通勤的时候听正合适。",
            ),
            T(
                "我家 toddler 最近总是 tantrum，怎么处理？",
                "两三岁的孩子 tantrum 很正常，他们情绪来了但还不会表达。发作的时候先保持冷静，确保安全，蹲下来用简单的话说出他的感受：'你很生气，因为想要那个玩具。' 不要在那个时候讲道理，也不要因为哭闹就妥协。等他平静下来再抱抱他。平时提前预告转换，比如 '再玩五分钟就要回家了'，能减少很多崩溃。",
            ),
            T(
                "Figma 里 auto layout 怎么用？",
                "选中几个元素或者一个 frame，按 Shift+A 就能加 auto layout。然后在右侧面板设置方向（水平或垂直）、元素之间的 spacing 和 padding。子元素可以设置成 'Fill container' 或 'Hug contents'，前者撑满父容器，后者随内容变化。做按钮、列表、卡片时特别好用，改文字长度时布局会自动调整。嵌套多层 auto layout 可以搭出完整的页面。",
            ),
            T(
                "下周出差去深圳，有什么好吃的推荐？",
                "深圳的潮汕菜很地道，一定要吃一顿潮汕牛肉火锅，点吊龙、匙柄和牛肉丸。早茶可以去老字号的茶楼，虾饺、肠粉、凤爪都不错。想吃海鲜可以去蛇口海上世界或者南澳。南山和福田有很多各地风味的小馆子，深圳是移民城市，湘菜、客家菜也都很好找。晚上可以去华侨城创意园附近走走。",
            ),
            T(
                "A/B test 的样本量怎么算？",
                "需要确定四个数：baseline conversion rate、你希望能检测到的最小效果 MDE、显著性水平 alpha（一般 0.05）和 power（一般 0.8）。比如 baseline 是 10%，想检测 1 个百分点的提升，每组大约需要一万四千多个样本。可以用 Evan Miller 的在线计算器，或者 statsmodels 里的 power 函数算。样本量不够就提前看结果，很容易得出错误结论。",
            ),
            T(
                "最近想戒糖，有什么 tips？",
                "先从含糖饮料开始，这是最大的糖来源，奶茶、果汁、可乐换成无糖茶、气泡水或者白水。家里不囤零食和甜点，想吃的时候用水果、坚果或者无糖酸奶代替。看配料表，很多酱料、面包、燕麦片里都加了糖。前一两周会比较难熬，之后味觉会变得更敏感，原来的甜食会觉得太甜。不用追求完全不吃，减少就很好。",
            ),
        ],
        dep=2,
        final="回到 OKR 那件事，VP 觉得 activation 那条目标有点激进，如果那条下调，另外两条 KR 要不要跟着调？原来定的数是多少来着？",
        note="需要 Q3 OKR 那一轮：KR1 activation 22%→30%，KR2 onboarding 完成率 45%→65%，KR3 首次创建 project 时间 3天→1天内。",
    )
)

# m9 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-rag-wiki-chunking",
        lang="mixed",
        schema="openai.chat",
        system="你是一个 AI/ML 工程助手，也能帮忙处理各种杂事。用户习惯中英混用。",
        turns=[
            T(
                "帮我给这个 function 起个名字，它把 UTC timestamp 转成用户本地时区的格式化字符串。",
                "几个候选：format_local_time(ts, tz)、to_user_local_str(ts, tz)、render_local_timestamp(ts, tz)。我比较推荐 format_in_timezone(ts, tz)，名字直接说明了行为，也提醒调用方要传 timezone。如果 timezone 是从 user 对象里取的，可以叫 format_for_user(ts, user)。避免用 convert_time 这种太泛的名字。",
            ),
            T(
                "周末想去 Costco 囤货，有什么值得买的？",
                "性价比高的有：Kirkland 的坚果和橄榄油、冷冻的三文鱼和牛排、大包装的纸巾和洗衣液、烤鸡，还有现烤的面包和牛角包。水果里车厘子、蓝莓在季节的时候很划算。注意量都很大，生鲜买之前想好能不能吃完或者冷冻得下。一次买太多零食容易浪费，可以约朋友一起去分。",
            ),
            T(
                "PyTorch 里 model.eval() 和 torch.no_grad() 有什么区别？",
                "两个完全是不同的东西。model.eval() 切换的是 module 的行为，比如让 Dropout 不再随机丢弃、BatchNorm 使用 running stats 而不是当前 batch 的统计量。torch.no_grad() 是关闭 autograd，不记录计算图，省显存、速度更快。inference 的时候两个都要用：先 model.eval()，再在 with torch.no_grad() 或者 torch.inference_mode() 里跑 forward。",
            ),
            T(
                "最近睡前老刷手机，有什么 app 能限制一下？",
                "iPhone 自带的 Screen Time 就够用：设置 Downtime，比如晚上 11 点到早上 7 点，只允许电话和几个必要的 app；再给社交媒体设置每日 App Limits。Android 用 Digital Wellbeing 的 Bedtime mode，屏幕会变成灰色，刷起来就没意思了。第三方的 one sec 会在打开 app 前强制你深呼吸几秒，效果出乎意料地好。",
            ),
            T(
                "帮我写个 Jira ticket 描述：登录页 SSO 跳转失败。",
                "Title: SSO login redirect fails with 'invalid_state' on login page。Description：Steps to reproduce：1. 打开 /login，2. 点 'Sign in with Okta'，3. 在 Okta 完成认证后跳回。Expected：跳回 dashboard。Actual：停在 /callback 显示 'invalid_state'。Environment：prod、Chrome 126，大约 30% 的用户受影响，从 6/12 deploy 之后开始。附上 HAR 文件和 error log 链接。",
            ),
            T(
                "冬天去北海道滑雪，Niseko 还是 Rusutsu？",
                "Niseko 名气最大，雪质好，还有很多餐厅、酒吧和英文服务，After-ski 很热闹，但人多、价格贵。Rusutsu 离 Niseko 大约四十分钟车程，人少很多，树林道非常棒，适合喜欢安静、想多滑一点的人，不过度假村以外几乎没什么可逛的。第一次去、想要热闹可以选 Niseko，技术比较好、讨厌排队的选 Rusutsu。",
            ),
            T(
                "GPU 显存 OOM 了，batch size 已经是 1 了，还能怎么办？",
                "几个方向：开 mixed precision，用 bf16 或者 fp16，显存几乎减半；打开 gradient checkpointing，用计算换显存；用 gradient accumulation 模拟大 batch。模型太大的话可以用 8-bit 的 optimizer，比如 bitsandbytes 的 AdamW8bit，或者上 LoRA 只训练少量参数。还要检查 sequence length，注意力的显存和长度平方相关，截短一点效果很明显。",
            ),
            T(
                "Team 里有人开会总是迟到，怎么提醒比较好？",
                "先私下聊，别在会上点名。可以很直接但友好地说：'注意到最近几次 standup 你都晚了几分钟，是时间冲突吗？' 有时候是日历排得太满，前一个会总拖堂。如果是普遍问题，可以在团队层面定规则，比如会议准时开始、不给迟到的人补讲，或者把会议时间改成 25 分钟和 50 分钟，留出换场时间。",
            ),
            T(
                "推荐几个值得订阅的 tech blog。",
                "工程实践类：Cloudflare Blog、Netflix TechBlog、Uber Engineering、Stripe Engineering，经常有深入的系统设计文章。AI 相关的可以看 Lilian Weng 的 blog、Sebastian Raschka 的 Ahead of AI、Chip Huyen 的 blog。综合一点的订阅 The Pragmatic Engineer newsletter。用 RSS 阅读器，比如 Feedly 或者 Reeder，集中在一个地方看，效率高很多。",
            ),
            T(
                "我想给家里装个 smart lock，要注意啥？",
                "先量一下门的厚度和锁体的型号，国内大部分防盗门是标准锁体，换起来比较方便，但有些进口门不兼容。开锁方式推荐指纹加密码加机械钥匙备份。选 C 级锁芯，安全性更高。注意电池续航和低电量提醒，有些锁还支持 Type-C 应急供电。如果要接入 HomeKit 或者米家，确认一下协议支持。安装最好找官方师傅。",
            ),
            T(
                "Transformer 里的 positional encoding 是干嘛的？",
                "self-attention 本身是 permutation invariant 的，它不知道 token 的先后顺序，'狗咬人' 和 '人咬狗' 在它看来是一样的。positional encoding 就是把位置信息注入进去。原始论文用的是不同频率的 sin 和 cos 加到 embedding 上；后来有 learned positional embedding；现在的 LLM 大多用 RoPE，把位置编码成旋转，对长度外推更友好。",
            ),
            T(
                "面试 ML engineer 被问 bias-variance tradeoff，怎么答比较好？",
                "先给定义：bias 是模型假设太简单导致的系统性误差，表现为 underfitting；variance 是模型对训练数据太敏感，表现为 overfitting。总误差大致等于 bias 平方加 variance 加不可约噪声，模型复杂度上升时 bias 下降 variance 上升。然后结合实际说怎么诊断，比如看 train 和 validation 的 loss gap，以及怎么处理：正则化、更多数据、ensemble、early stopping。",
            ),
            T(
                "周五团建想去玩 escape room，上海有推荐吗？",
                "上海的密室选择很多，大众点评上评分高的店基本都不错。团建的话建议选恐怖程度低、机关多、需要协作的主题，有的人怕鬼，选恐怖本容易冷场。人数多的话可以分成两队玩同一个主题，最后比用时。很多店有适合六到十人的大主题。周五晚上很难订，提前一周在点评或者小程序上预约。",
            ),
            T(
                "我们做 RAG，文档是内部 wiki，现在 chunk 用的是固定 1000 字符切，检索效果很差，经常把一个段落切断，怎么改？",
                "建议改成按结构切：先按 Markdown heading 分 section，再在 section 里用 recursive splitter 按段落、句子切，target chunk size 大约 512 tokens，overlap 64 tokens，这样语义比较完整又不会太长。每个 chunk 前面 prepend 它所属的标题路径，比如 '部署 > K8s > 配置'，对 embedding 帮助很大。表格和 code block 尽量不要切开。改完之后拿一批真实 query 做 recall@5 评测，对比前后效果。",
            ),
            T(
                "Pandas 读一个 8GB 的 CSV，内存直接爆了，怎么办？",
                "先用 usecols 只读需要的列，再用 dtype 指定类型，比如把 int64 换成 int32、低基数的字符串列设成 category，内存能降好几倍。还不行就用 chunksize 分块读，每块处理完再汇总。长期来看建议把 CSV 转成 Parquet，读取又快又省空间。也可以直接换 Polars 或者 DuckDB，它们做这种大文件的 lazy 查询比 pandas 高效得多。",
            ),
            T(
                "家里老人想学用 smartphone 打视频电话，怎么教比较好？",
                "先把手机设置简单化：字体调大，把微信放在首屏第一个位置，其他不常用的 app 收进文件夹。教的时候只教一件事：怎么接视频和怎么发起视频，一步一步让他自己操作，不要替他点。把步骤写在纸上，配上截图，贴在手机旁边。每天固定时间打一次视频给他练习。耐心最重要，同一个问题问十遍也很正常。",
            ),
            T(
                "写一个 Python CLI，用 argparse 还是 click/typer？",
                "简单脚本、不想加依赖，用标准库的 argparse 就行。命令多、有子命令、想要漂亮的 help 和自动补全，推荐 Typer，它基于 Click，用 type hints 定义参数，代码很简洁，写起来最舒服。Click 更成熟，插件和扩展多，适合比较复杂的 CLI。如果是团队内部工具，Typer 加 Rich 做输出，体验非常好。",
            ),
            T(
                "想买个 standing desk，电动的值得吗？",
                "值得，手摇的调一次要转好久，最后大家都懒得调，基本变成一张普通桌子。电动的选双电机的，稳定性和承重都更好，升降时不容易晃。看一下高度范围，确保最低和最高都适合你的身高，带记忆高度的控制面板很方便。桌面宽度至少 140 厘米，放双屏会比较舒服。站着的时候配一块抗疲劳垫。",
            ),
            T(
                "LoRA fine-tune 的时候 rank 一般设多少？",
                "常见的起点是 r=8 或者 r=16，alpha 设成 rank 的一到两倍，比如 r=16、alpha=32。任务和预训练分布接近，比如指令跟随、风格调整，小 rank 就够了；要学很多新知识或者新语言，可以加到 64 甚至更高。target modules 除了 q、v 之外把 k、o 和 MLP 层也加上，效果通常更好。最终还是要在 validation set 上对比几组。",
            ),
            T(
                "我在考虑读个 part-time MBA，值得吗？",
                "看你的目标。如果想从技术转到管理或者产品、想换行业、想拓展人脉，MBA 的帮助比较明显，尤其是好学校的校友网络。如果只是想在现在的技术路线上升职，MBA 的回报可能不如直接做更有影响力的项目。part-time 的好处是不用辞职，但两三年里工作加学习会很累，最好和家人商量好，看公司是否有学费补贴。",
            ),
            T(
                "Docker compose 里怎么让 service 等 DB ready 了再启动？",
                "depends_on 默认只保证启动顺序，不保证 DB 已经能接连接了。正确做法是给 DB 加 healthcheck，比如 Postgres 用 'pg_isready -U postgres'，然后在 app 的 depends_on 里写 db: condition: service_healthy。这样 compose 会等 healthcheck 通过才启动 app。app 本身最好也有连接重试逻辑，因为 DB 在运行中也可能重启。",
            ),
            T(
                "朋友刚生了宝宝，送什么礼物好？",
                "实用型的最受欢迎：纸尿裤和湿巾永远不嫌多，可以买大一号的尺码；好一点的连体衣也买大一码，宝宝长得很快。也可以送一个温奶器、婴儿背带或者安抚巾。如果想送给新手妈妈，一次产后按摩或者一张外卖代金券会非常贴心。记得先问问对方缺什么，避免重复收到好几个同样的东西。",
            ),
        ],
        dep=13,
        final="回到 wiki 检索那个事，切块的长度和重叠你当时建议的是多少？我想试试调到 768 会不会更好。",
        note="间接提到 RAG 切块（“wiki 检索”）；需要那一轮的建议：按 heading 切，chunk 512 tokens、overlap 64 tokens。",
    )
)

# m10 -------------------------------------------------------------------------
CONVOS.append(
    C(
        id="mix-nginx-504-gunicorn-timeout",
        lang="mixed",
        schema="openai.chat",
        system="You are a helpful engineering assistant. 用户会中英混用。",
        turns=[
            T(
                "怎么跟 recruiter negotiate offer？对方给的 base 比我预期低 15%。",
                "先表达兴趣，再谈数字：'我很喜欢这个团队和这个 role，但 base 比我的预期低不少。' 给一个具体的数字，最好有依据，比如 Levels.fyi 上同 level 的数据或者你手上的其他 offer。如果 base 有 band 限制，可以谈 sign-on bonus、RSU、level 或者入职时间。整个过程保持礼貌和正面，recruiter 其实也希望 close 这个 offer。",
            ),
            T(
                "周末想去莫干山住民宿，有什么推荐？",
                "莫干山的民宿分几种风格：想要设计感和景观的，可以找山顶或者竹林边的精品民宿，很多有无边泳池；带孩子的选有大草坪和亲子活动的；预算有限可以住在庾村附近，吃饭和交通都方便。周末价格会比平时高不少，建议提前两三周订。白天可以去剑池徒步，晚上在民宿里烤火看星星。",
            ),
            T(
                "Go 的 error wrapping 用 %w 有什么好处？",
                '用 fmt.Errorf("load config: %w", err) 包装之后，错误信息会带上上下文，调用链上每一层都能加一句说明，排查问题容易很多。更重要的是原始 error 还保留着，上层可以用 errors.Is(err, os.ErrNotExist) 或者 errors.As 判断具体的错误类型，而用 %v 包装就会丢失这个信息。注意不要把内部实现的 error 暴露成 API 的一部分。',
            ),
            T(
                "Nginx 后面是一个 Flask app，导出报表的 API 要跑 90 秒左右，前端一直拿到 504 Gateway Timeout，怎么办？",
                "504 是 nginx 等 upstream 超时了，默认 proxy_read_timeout 是 60s，你的请求要 90s 当然会超。短期可以在对应的 location 里把 proxy_read_timeout 调到 120s，同时检查 gunicorn 的 --timeout，默认只有 30s，不改的话 worker 会先被杀掉，变成 502。长期更好的做法是改成 async job：API 立即返回 202 和 job_id，后台用 Celery 跑导出，前端 poll 状态，完成后再下载。",
            ),
            T(
                "我的 Mac 上 Homebrew 装的 Python 和系统的 Python 打架，怎么整？",
                "不要直接用系统 Python，也尽量别往 Homebrew 的 Python 里 pip install 全局包。推荐用 pyenv 或者 uv 来管理 Python 版本，每个项目建一个独立的 venv。检查一下 PATH，用 which -a python3 看看有几个，确保 shell 配置里 pyenv 或者 Homebrew 的路径在前面。全局的命令行工具用 pipx 装，每个工具都有独立环境，互不干扰。",
            ),
            T(
                "最近想 cut carbs，早餐吃啥？",
                "可以吃鸡蛋，炒蛋、水煮蛋或者做成蔬菜 omelette，加点菠菜、蘑菇和奶酪；希腊酸奶加坚果和几颗蓝莓；牛油果配烟熏三文鱼；或者一杯无糖豆浆加一把坚果。蛋白质和脂肪充足，一上午都不容易饿。刚开始可能会有点不习惯，注意多喝水、多吃蔬菜补充纤维。",
            ),
            T(
                "帮我写个 cron 表达式，每个工作日早上 9:30 跑。",
                "标准五段式 cron：'30 9 * * 1-5'，分别是分钟 30、小时 9、每天、每月、周一到周五。注意 cron 用的是服务器的时区，如果服务器是 UTC 而你要的是北京时间 9:30，要写成 '30 1 * * 1-5'。Kubernetes CronJob 从 1.27 开始可以用 timeZone 字段直接指定时区，比如 Asia/Shanghai，会省事很多。",
            ),
            T(
                "家里小孩的 screen time 怎么管比较好？",
                "和孩子一起定规则，而不是单方面宣布：比如上学日每天 30 分钟到 1 小时，作业做完之后才能用，吃饭和睡前一小时不用屏幕。内容比时长更重要，优先选有互动、有教育意义的内容，大人尽量陪着看。用系统自带的家长控制设置时间限制，到点自动锁定，减少争吵。大人自己也要以身作则。",
            ),
            T(
                "Protobuf 里的字段编号可以改吗？",
                '不要改。protobuf 在序列化时只用字段编号来识别字段，名字根本不在 wire format 里，改了编号老的客户端和新的服务端就对不上了，数据会被解析错或者丢掉。字段名可以改，编号不能动。不再使用的字段，要用 reserved 把编号和名字都保留起来，防止以后有人复用，比如 reserved 4; reserved "old_name";。',
            ),
            T(
                "下周 onsite interview，需要准备 system design 吗？",
                "看 level 和公司。一般 mid-level 以上的 backend 岗位基本都会有一轮 system design，senior 以上可能还有两轮。可以问一下 recruiter 具体的面试结构，大部分 recruiter 很愿意告诉你每一轮考什么。准备的话，先熟悉一个通用框架：需求澄清、估算、high-level design、深入关键组件、讨论 trade-off，然后练几道经典题。",
            ),
        ],
        dep=3,
        final="回到导出报表那个超时，我按你说的把 nginx 那个参数调大了，现在变成 502 了，是不是还漏了什么？",
        note="需要 nginx 504 那一轮：除了 proxy_read_timeout 还要调 gunicorn --timeout（默认30s），否则 worker 被杀变成 502。",
    )
)
